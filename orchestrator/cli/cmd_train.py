"""`train`: parse the request, run it (orchestrator/run/lifecycle.py), exit with its status."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from .. import defaults
from ..cluster.inventory import load_cluster
from ..errors import LaunchError
from ..resources import project
from ..run.command import (
    TorchrunOptions,
    check_arguments_size,
    check_torchrun_args,
    parse_env,
)
from ..run.follow import HangWatch, OnHang
from ..run.lifecycle import MODULE_NAME, TrainRequest, check_grace, run_training
from ..run.record import check_writable
from .cmd_doctor import add_measure_args, diagnose_cluster, parse_request as doctor_request
from .cmd_preflight import add_selection_args


def parse_request(args: argparse.Namespace) -> TrainRequest:
    workdir = Path(args.workdir).expanduser()
    if not workdir.is_dir():
        raise LaunchError(f"--workdir {workdir}: no such directory; point --workdir at the "
                          "directory that holds your training code")
    script, rest = args.script or defaults.SCRIPT, list(args.script_args or [])
    check_no_tool_options(args.tool_options, args.script, rest)
    rest += getattr(args, "after_separator", None) or []   # after `--`: the script's
    if args.module:  # `-m pkg.mod -- ARGS`: no script; what follows is the module's
        script, rest = args.module, [*([args.script] if args.script else []), *rest]
        if not MODULE_NAME.match(script):
            raise LaunchError(f"-m {script!r} is not a module name (dotted Python "
                              "identifiers, e.g. -m mypkg.train)")
    elif script.startswith("-"):  # `train --nodes 2 -- --epochs 3`: no script named
        script, rest = defaults.SCRIPT, [script, *rest]
    if not args.module and Path(script).is_absolute():
        try:
            script = str(Path(script).resolve().relative_to(workdir.resolve()))
        except ValueError:
            raise LaunchError(f"script {args.script} is outside --workdir {workdir}; only "
                              "the work directory is copied to the nodes") from None
    if not args.module and (workdir / script).is_dir():
        inside = sorted(p.name for p in (workdir / script).glob("*.py"))[:5]
        raise LaunchError(f"script {script!r} is a directory in {workdir.resolve()}; name the "
                          "script in it" + (f" (it holds {', '.join(inside)})" if inside else "")
                          + ", or run a package with -m")
    if not args.module and not (workdir / script).is_file():
        raise LaunchError(f"script {script!r} not found in {workdir.resolve()}; give a path "
                          "relative to --workdir (default: the repository's train/)")
    if rest and rest[0] == "--":
        rest = rest[1:]
    if args.nproc_per_node == "auto":
        nproc = None
    else:
        try:
            nproc = int(args.nproc_per_node)
            if nproc < 1:
                raise ValueError
        except ValueError:
            raise LaunchError(f"--nproc-per-node {args.nproc_per_node!r}: give 'auto' or a "
                              "positive number") from None
    if args.master_port is not None and not 1 <= args.master_port <= 65535:
        raise LaunchError(f"--master-port {args.master_port}: choose a port in 1024-65535")
    if args.max_restarts < 0:
        raise LaunchError(f"--max-restarts {args.max_restarts}: give 0 (fail on the first "
                          "worker failure) or a positive number of restarts")
    check_grace(args.grace)
    if args.keep_runs < 0:
        raise LaunchError(f"--keep-runs {args.keep_runs}: give 0 (keep all) or more")
    if not math.isfinite(args.lease_timeout) or args.lease_timeout < 3:
        raise LaunchError(f"--lease-timeout {args.lease_timeout}: give at least 3 seconds")
    env = parse_env(args.env)
    extra = tuple(args.torchrun_arg or ())
    check_torchrun_args(extra)
    check_arguments_size(tuple(rest), env)
    runs_dir = Path(args.runs_dir)
    check_writable(runs_dir, "--runs-dir")
    return TrainRequest(workdir, script, tuple(rest), env, nproc,
                        args.master_port,
                        TorchrunOptions(max_restarts=args.max_restarts,
                                        rdzv_backend=args.rdzv_backend, extra=extra),
                        module=bool(args.module), clean_exit=args.clean_exit,
                        runs_dir=runs_dir, detach=args.detach,
                        dry_run=args.dry_run, lease_timeout=args.lease_timeout,
                        grace=args.grace, keep_runs=args.keep_runs)


def check_no_tool_options(ours: frozenset[str], script: str | None, rest: list[str]) -> None:
    """Everything after the script goes to the script, but one of train's own options
    (OURS) there, before any `--`, was surely meant for train: refuse it, saying where it
    goes."""
    if not script or script.startswith("-"):
        return
    for word in rest:
        if word == "--":
            return
        if word.split("=", 1)[0] in ours:
            raise LaunchError(
                f"{word} comes after the script {script}, where it would be the script's "
                f"argument, but it is an option of train: put it before the script "
                f"(train {word} ... {script}), or after -- to pass it to the script "
                f"(train ... {script} -- {word})")


def unknown_hint(tail: list[str]) -> str:
    """What an option train does not know (TAIL: the words from it on) most likely is:
    the script's."""
    return ("options for the script go after --, e.g. python -m orchestrator train "
            f"--nodes 2 [SCRIPT] -- {' '.join(tail)}")


def hang_watch(args: argparse.Namespace) -> HangWatch:
    timeout = args.hang_timeout
    if not math.isfinite(timeout) or timeout < 0:
        raise LaunchError(f"--hang-timeout {timeout}: give the seconds without progress after "
                          "which the run counts as hung, as a number of 0 or more (0: never; "
                          f"default {defaults.HANG_TIMEOUT:g})")
    return HangWatch(timeout, OnHang(args.on_hang))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="run a training script on the cluster with torchrun",
                       description="Preflight every node, copy the code into a per-run "
                       "snapshot, start torchrun on all nodes at once, stream their logs, "
                       "and stop the job everywhere if one node fails or on Ctrl-C.")
    add_selection_args(p)
    p.add_argument("--workdir", default=str(project().train),
                   help="local directory with the training code (default: %(default)s)")
    p.add_argument("--env", action="append", metavar="K=V",
                   help="environment variable for the job (repeatable)")
    p.add_argument("--nproc-per-node", default="auto",
                   help="processes per node: a number, or auto (GPUs per node; 1 with gloo "
                   "on CPU nodes) (default: auto)")
    p.add_argument("--master-port", type=int,
                   help="rendezvous port on node 0 (default: cluster_rendezvous_port or "
                   "29500; another free one is picked if it is in use)")
    p.add_argument("--max-restarts", type=int, default=0, help="torchrun --max-restarts")
    p.add_argument("--rdzv-backend", choices=("static", "c10d"), default="static",
                   help="rendezvous: static (--master-addr/--master-port) or c10d")
    p.add_argument("--torchrun-arg", action="append", metavar="ARG",
                   help="extra torchrun option, verbatim (repeatable), e.g. "
                   "--torchrun-arg=--monitor-interval=1")
    p.add_argument("--runs-dir", default=str(defaults.RUNS_DIR),
                   help="where run records go (default: %(default)s)")
    p.add_argument("--grace", type=float, default=defaults.GRACE,
                   help="seconds between SIGTERM and SIGKILL at teardown (default: %(default)s)")
    p.add_argument("--detach", action="store_true",
                   help="return once the job runs on every node; the nodes supervise it "
                   "(follow it with `attach RUN`, stop it with `stop RUN`)")
    p.add_argument("--lease-timeout", type=float, default=defaults.LEASE_TIMEOUT,
                   help="seconds after which the nodes stop an attached run whose "
                   "controller vanished without a word (killed, network cut, laptop "
                   "asleep); a closed terminal or kill -9 is noticed at once "
                   "(default: %(default)s)")
    p.add_argument("--keep-runs", type=int, default=defaults.KEEP_RUNS, metavar="N",
                   help="on each node, keep the code snapshots and job directories of the "
                   "N newest runs (never a live run's); 0 keeps all (default: %(default)s)")
    p.add_argument("--hang-timeout", type=float, default=defaults.HANG_TIMEOUT, metavar="S",
                   help="the run is hung when it printed nothing (no line, no beat) for S "
                   "seconds: every rank's stack is then dumped and the rank that holds the "
                   "others up is named (runs/RUN/hang/). Keep it below the backend's "
                   "collective timeout (NCCL 10 min, gloo 30 min by default), or the ranks "
                   "fail before they are dumped; 0: never (default: %(default)s)")
    p.add_argument("--on-hang", choices=[str(o) for o in OnHang], default=str(OnHang.STOP),
                   help="after the diagnosis of a hang: stop the run (status hung, exit 1) "
                   "or wait (keep it, keep watching) (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the nodes and print the exact per-node commands; start nothing")
    p.add_argument("--doctor", action="store_true",
                   help="run `doctor` on the nodes first and start nothing if it names a "
                   "suspect")
    p.add_argument("--ignore-suspects", action="store_true",
                   help="with --doctor: start the run even if doctor names suspects")
    add_measure_args(p)
    p.add_argument("-m", "--module", metavar="MODULE",
                   help="run a module as `python -m MODULE` (from --workdir, or installed "
                   "on the nodes) instead of a script; its arguments follow --")
    p.add_argument("--no-clean-exit", dest="clean_exit", action="store_false",
                   help="start the script itself, not through the worker runner that ends "
                   "each finished worker with os._exit after atexit handlers and a flush "
                   "of every open file (which keeps torch's teardown from failing a "
                   "finished run)")
    p.add_argument("script", nargs="?", default=None,
                   help=f"training script, relative to --workdir (default: {defaults.SCRIPT})")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="arguments for the script (after --)")
    p.set_defaults(func=_main, unknown_hint=unknown_hint, takes_separator=True,
                   tool_options=frozenset(o for a in p._actions for o in a.option_strings))


def _main(args: argparse.Namespace) -> int:
    request = parse_request(args)
    watch = hang_watch(args)
    if args.ignore_suspects and not args.doctor:
        raise LaunchError("--ignore-suspects goes with --doctor")
    checkup = doctor_request(args) if args.doctor else None
    cluster = load_cluster(args.inventory).select(args.nodes, args.hosts)
    if checkup is not None and request.dry_run:  # doctor is a job: a dry run starts none
        print("# dry run: `doctor` would run first on these nodes; it was not run")
    elif checkup is not None:
        report = diagnose_cluster(cluster, checkup, as_json=False)
        if report.suspects and not args.ignore_suspects:
            raise LaunchError(
                f"doctor (run {report.run_id}) names "
                + "; ".join(f"{s.node}: {s.why}" for s in report.suspects)
                + ". Nothing was started: leave the node out (--hosts), fix it, or start "
                "anyway with --ignore-suspects")
    return run_training(request, watch, cluster)
