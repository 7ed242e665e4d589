"""`train`: preflight, sync the code, start torchrun on every node, stream logs, tear down.

    python -m orchestrator train --nodes 2 ddp.py -- --epochs 3
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .command import (
    DEFAULT_KEEP_RUNS,
    DEFAULT_LEASE_TIMEOUT,
    NodeCommand,
    TorchrunOptions,
    parse_env,
)
from .errors import LaunchError
from .inventory import load_cluster
from .job import DEFAULT_HANG_TIMEOUT, HangWatch, Job, JobResult, OnHang
from .preflight import add_selection_args, print_report, raise_if_blocked, run_preflight
from .probe import NodeFacts, release_port
from .resources import project
from .runs import DEFAULT_RUNS_DIR, RunDir, RunStatus, code_revision, iso, new_run_id, run_state_dir
from .supervisor import End
from .sync import sync_code
from .teardown import DEFAULT_GRACE
from .worker_end import NodeEnd, NodeEnds, how_it_ended, judge, root_cause, scan_log

DEFAULT_SCRIPT = "train.py"
MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class TrainRequest:
    """The user's request, checked before any node is touched."""

    workdir: Path
    script: str
    script_args: tuple[str, ...]
    env: dict[str, str]
    nproc: int | None            # None: auto (GPUs per node, or 1 with gloo)
    master_port: int | None      # None: the inventory's rendezvous port, moved if taken
    options: TorchrunOptions
    module: bool = False         # script is a module name (`-m pkg.mod`)
    clean_exit: bool = True      # workers start through the runner (run_worker.py)


def parse_request(args: argparse.Namespace) -> TrainRequest:
    workdir = Path(args.workdir).expanduser()
    if not workdir.is_dir():
        raise LaunchError(f"--workdir {workdir}: no such directory; point --workdir at the "
                          "directory that holds your training code")
    script, rest = args.script or DEFAULT_SCRIPT, list(args.script_args or [])
    if args.module:  # `-m pkg.mod -- ARGS`: no script; what follows is the module's
        script, rest = args.module, [*([args.script] if args.script else []), *rest]
        if not MODULE_NAME.match(script):
            raise LaunchError(f"-m {script!r} is not a module name (dotted Python "
                              "identifiers, e.g. -m mypkg.train)")
    elif script.startswith("-"):  # `train --nodes 2 -- --epochs 3`: no script named
        script, rest = DEFAULT_SCRIPT, [script, *rest]
    if not args.module and Path(script).is_absolute():
        try:
            script = str(Path(script).resolve().relative_to(workdir.resolve()))
        except ValueError:
            raise LaunchError(f"script {args.script} is outside --workdir {workdir}; only "
                              "the work directory is copied to the nodes") from None
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
    return TrainRequest(workdir, script, tuple(rest), parse_env(args.env), nproc,
                        args.master_port,
                        TorchrunOptions(max_restarts=args.max_restarts,
                                        rdzv_backend=args.rdzv_backend,
                                        extra=tuple(args.torchrun_arg or ())),
                        module=bool(args.module), clean_exit=args.clean_exit)


def hang_watch(args: argparse.Namespace) -> HangWatch:
    timeout = args.hang_timeout
    if not math.isfinite(timeout) or timeout < 0:
        raise LaunchError(f"--hang-timeout {timeout}: give the seconds without progress after "
                          "which the run counts as hung, as a number of 0 or more (0: never; "
                          f"default {DEFAULT_HANG_TIMEOUT:g})")
    return HangWatch(timeout, OnHang(args.on_hang))


def check_grace(grace: float) -> None:
    if not math.isfinite(grace) or grace < 0:
        raise LaunchError(f"--grace {grace}: give the seconds between SIGTERM and SIGKILL "
                          f"as a number of 0 or more (default {DEFAULT_GRACE:g})")


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
    p.add_argument("--runs-dir", default=str(DEFAULT_RUNS_DIR),
                   help="where run records go (default: %(default)s)")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE,
                   help="seconds between SIGTERM and SIGKILL at teardown (default: %(default)s)")
    p.add_argument("--detach", action="store_true",
                   help="return once the job runs on every node; the nodes supervise it "
                   "(follow it with `attach RUN`, stop it with `stop RUN`)")
    p.add_argument("--lease-timeout", type=float, default=DEFAULT_LEASE_TIMEOUT,
                   help="seconds after which the nodes stop an attached run whose "
                   "controller vanished without a word (killed, network cut, laptop "
                   "asleep); a closed terminal or kill -9 is noticed at once "
                   "(default: %(default)s)")
    p.add_argument("--keep-runs", type=int, default=DEFAULT_KEEP_RUNS, metavar="N",
                   help="on each node, keep the code snapshots and job directories of the "
                   "N newest runs (never a live run's); 0 keeps all (default: %(default)s)")
    p.add_argument("--hang-timeout", type=float, default=DEFAULT_HANG_TIMEOUT, metavar="S",
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
    p.add_argument("-m", "--module", metavar="MODULE",
                   help="run a module as `python -m MODULE` (from --workdir, or installed "
                   "on the nodes) instead of a script; its arguments follow --")
    p.add_argument("--no-clean-exit", dest="clean_exit", action="store_false",
                   help="start the script itself, not through the worker runner that ends "
                   "each finished worker with os._exit after atexit handlers and a flush "
                   "of every open file (which keeps torch's teardown from failing a "
                   "finished run)")
    p.add_argument("script", nargs="?", default=None,
                   help=f"training script, relative to --workdir (default: {DEFAULT_SCRIPT})")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="arguments for the script (after --)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    request = parse_request(args)
    watch = hang_watch(args)
    cluster = load_cluster(args.inventory).select(args.nodes, args.hosts)
    run_id = new_run_id()
    report = run_preflight(cluster, request.master_port,
                           strict_port=request.master_port is not None,
                           keep_connections=True, nproc_per_node=request.nproc,
                           run_id=None if args.dry_run else run_id)
    try:
        print_report(report)
        raise_if_blocked(report)
        commands = [
            NodeCommand(run_id=run_id, node_rank=i, nnodes=len(cluster.nodes),
                        nproc=report.nproc(facts),
                        master_addr=report.master_addr or cluster.nodes[0].cluster_address,
                        master_port=report.master_port or cluster.rendezvous_port,
                        torchrun=_torchrun(facts), home=str(facts.home),
                        script=request.script, script_args=request.script_args,
                        env={"CLUSTERTRAIN_BACKEND": report.backend, **request.env},
                        options=request.options, node=facts.node.name,
                        nodes=tuple(cluster.names), python=facts.node.python,
                        run_state=run_state_dir(cluster.shared_path, str(facts.user), run_id),
                        attached=not args.detach, lease_timeout=args.lease_timeout,
                        grace=args.grace, keep_runs=args.keep_runs, module=request.module,
                        clean_exit=request.clean_exit,
                        hang_timeout=watch.timeout, on_hang=str(watch.on_hang),
                        cluster_env=facts.node.cluster_env_file)
            for i, facts in enumerate(report.facts)]
        facts_by = {f.node.name: f for f in report.facts}
        if args.dry_run:
            for spec, cmd in zip(cluster.nodes, commands, strict=True):
                print(f"# {spec.name} ({facts_by[spec.name].user}@{spec.host}), node rank "
                      f"{cmd.node_rank}")
                print(cmd.shell())
            print(f"# dry run: code would be synced from {request.workdir.resolve()} to "
                  f"{commands[0].code_dir}; nothing was started")
            return 0
        run = RunDir(Path(args.runs_dir), run_id)
        info = {
            "run_id": run_id, "inventory": str(cluster.inventory.resolve()),
            "nodes": cluster.names, "workdir": str(request.workdir.resolve()),
            "users": {f.node.name: f.user for f in report.facts},
            "script": request.script, "script_args": list(request.script_args),
            "module": request.module, "clean_exit": request.clean_exit,
            "master": {"addr": commands[0].master_addr, "port": commands[0].master_port},
            "commands": {s.name: c.torchrun_argv()
                         for s, c in zip(cluster.nodes, commands, strict=True)},
            "code_revision": code_revision(request.workdir),
            "fingerprint": report.fingerprint,
            "detached": args.detach,
            "hang_timeout": watch.timeout, "on_hang": str(watch.on_hang),
            "node_commands": {c.node: c.to_record() for c in commands},
        }
        run.create(info)
        started = time.time()
        try:
            print(f"run {run_id}: syncing {request.workdir.resolve()} to "
                  f"{len(cluster.nodes)} node(s)", flush=True)
            synced = sync_code(cluster, request.workdir, run_id, clients=report.clients)
            if synced.reused:
                print(f"run {run_id}: code unchanged since the last sync on "
                      f"{', '.join(synced.reused)}: snapshot linked, not copied", flush=True)
            print(f"run {run_id}: code synced in {synced.seconds:.1f} s; starting torchrun on "
                  f"{', '.join(cluster.names)} (master {commands[0].master_addr}:"
                  f"{commands[0].master_port})", flush=True)
            job = Job(run, list(zip(cluster.nodes, commands, strict=True)), report.clients,
                      grace=args.grace, hang=watch)
            failed = job.launch()
            if failed:
                first = next(n for n in cluster.names if n in failed)
                raise LaunchError(f"{first}: {failed[first]}; the job was stopped on the "
                                  "other nodes")
            if args.detach:
                print(f"run {run_id}: running on {', '.join(cluster.names)}, supervised by "
                      "the nodes (detached).\n"
                      f"  follow it: python -m orchestrator attach {run_id} "
                      f"--runs-dir {args.runs_dir}\n"
                      f"  stop it:   python -m orchestrator stop {run_id} "
                      f"--runs-dir {args.runs_dir}", flush=True)
                return 0
            result = job.run(attached=True)
        except BaseException as exc:
            # Every exit path leaves a summary: never a record that says "running" for a
            # run that is gone.
            run.write_summary({**info, "status": RunStatus.INTERRUPTED if isinstance(
                exc, KeyboardInterrupt) else RunStatus.FAILED, "start": iso(started),
                               "end": iso(time.time()), "error": str(exc) or repr(exc)})
            raise
        summary = make_summary(info, commands, cluster.names, result, synced.seconds, run)
        run.write_summary(summary)
        return _conclude(run, result, summary)
    finally:
        node0 = report.clients.get(cluster.nodes[0].name)
        if node0 is not None and not args.dry_run:
            try:
                release_port(node0, run_id)
            except (OSError, TimeoutError):
                pass  # the claim lapses by itself
        report.close()


def _torchrun(facts: NodeFacts) -> str:
    """The node's torchrun; raise_if_blocked refused every node whose python_env is unset."""
    assert facts.python_env is not None
    return facts.python_env["torchrun"]


def make_summary(info: dict, commands: list[NodeCommand], names: list[str],
                 result: JobResult, sync_seconds: float, run: RunDir) -> dict:
    stop_requested = (run.path / "stop-requested").exists()
    ends = read_ends(names, run)
    nodes = [NodeEnd(n, c.nproc, result.outcomes[n].exit_code, result.outcomes[n].reason,
                     result.outcomes[n].ended) for n, c in zip(names, commands, strict=True)]
    verdict = judge(nodes, ends, clean_exit=all(c.clean_exit for c in commands))
    # Every rank's script finished with code 0 (its marker): the training completed,
    # whatever killed a worker after that (torch's teardown).
    status = (RunStatus.SUCCEEDED if result.ok else RunStatus.STOPPED if stop_requested
              else RunStatus.INTERRUPTED if result.interrupted
              else RunStatus.HUNG if result.hung
              else RunStatus.SUCCEEDED if verdict.training_completed else RunStatus.FAILED)
    first = root_cause(result.first_failed, nodes, ends) if status == RunStatus.FAILED \
        else None

    def node_end(name: str) -> dict:
        outcome = result.outcomes[name]
        if first and name == result.first_failed and name != first:
            # It failed first only because FIRST's ranks went away under its collectives.
            return {"end_reason": End.PEER_FAILED, "why": first}
        return {"end_reason": outcome.reason, **({"why": outcome.why} if outcome.why else {})}

    return {
        **info,
        "status": status,
        "start": iso(result.started), "end": iso(result.ended),
        "duration_s": round(result.ended - result.started, 3),
        "sync_s": round(sync_seconds, 3),
        "nodes": [{"name": n, "node_rank": c.node_rank, "nproc": c.nproc,
                   "exit_code": result.outcomes[n].exit_code, **node_end(n),
                   "log": str(run.log(n))} for n, c in zip(names, commands, strict=True)],
        "exit_codes": {n: result.outcomes[n].exit_code for n in names},
        "first_failed": first,
        "training_completed": True if result.ok else verdict.training_completed,
        **({"after_finish": verdict.after_finish} if verdict.after_finish else {}),
        "rank_exit_codes": {n: {str(r): c for r, c in sorted(codes.items())}
                            for n, codes in verdict.exit_codes.items()},
        "command": {n: shlex.join(c.torchrun_argv()) for n, c in zip(names, commands, strict=True)},
        **({"hang": result.hang} if result.hang else {}),
        **({"step_times": result.progress["nodes"]} if result.progress.get("nodes") else {}),
        **({"stragglers": result.progress["stragglers"]}
           if result.progress.get("stragglers") else {}),
    }


def read_ends(names: list[str], run: RunDir) -> dict[str, NodeEnds]:
    """How each node's ranks ended, from the worker runner's markers and torchrun's
    failure reports in the nodes' logs (worker_end.py)."""
    ends: dict[str, NodeEnds] = {}
    for n in names:
        try:
            with open(run.log(n), encoding="utf-8", errors="replace") as log:
                ends[n] = scan_log(log)
        except OSError:
            ends[n] = NodeEnds()
    return ends


def _conclude(run: RunDir, result: JobResult, summary: dict) -> int:
    print(f"run {run.run_id}: {summary['status']} after {summary['duration_s']:.1f} s; "
          f"logs and summary in {run.path}/", flush=True)
    after = summary.get("after_finish") or {}
    if summary["status"] == RunStatus.SUCCEEDED:
        if after:  # finished, then a worker died in torch's teardown: not the training
            print(f"run {run.run_id}: the training completed on every rank; "
                  f"{'; '.join(n for notes in after.values() for n in notes)}",
                  file=sys.stderr)
        return 0
    if summary["status"] == RunStatus.HUNG:
        hang = summary["hang"]
        named = "; ".join(f"rank {s['rank']} on {s['node']} {s['why']}"
                          for s in hang["suspects"]) or f"nobody ({hang['verdict']})"
        raise LaunchError(f"run {run.run_id} hung: no rank made progress for "
                          f"{hang['quiet_s']:.0f} s; holding it up: {named}. The job was "
                          f"stopped on every node. Every rank's stack: {hang['dumps']}/")
    if summary["status"] in (RunStatus.INTERRUPTED, RunStatus.STOPPED):
        print(f"run {run.run_id}: {summary['status']}; the job was stopped on every node",
              file=sys.stderr)
        return 130 if summary["status"] == RunStatus.INTERRUPTED else 1
    failed = summary.get("first_failed") or next(
        (n for n, o in result.outcomes.items() if o.failed), None)
    outcome = result.outcomes.get(failed) if failed else None
    how = ("lost its connection" if outcome and outcome.reason == End.LOST
           else "had its clustertrain supervisor fail"
           if outcome and outcome.reason == End.SUPERVISOR_FAILED
           else f"exited with code {outcome.exit_code}" if outcome else "failed")
    ranks = (summary.get("rank_exit_codes") or {}).get(failed) or {}
    if any(c != 0 for c in ranks.values()):  # the script's own code, e.g. sys.exit(3)
        how += " (" + ", ".join(f"rank {r} {how_it_ended(c)}" for r, c in ranks.items()
                                if c != 0) + ")"
    if result.first_failed and result.first_failed != failed:
        how += (f"; {result.first_failed} ended before it only because its ranks lost "
                f"their peers on {failed}")
    if failed in after:  # not the node's fault: its ranks had finished their scripts
        how = (f"exited with code {outcome.exit_code if outcome else '?'} after its ranks "
               f"finished ({'; '.join(after[failed])}), but not every rank of the run "
               "had finished its script")
    lines = list(outcome.last_worker_lines) if outcome else []
    lines += [line for line in (outcome.last_lines if outcome else [])
              if "/rank" not in line.split(" | ")[0]]
    tail = "\n    ".join(lines) if lines else "(no output)"
    hang = summary.get("hang")
    held = ("\nA collective timed out; holding it up: " + ("; ".join(
        f"rank {s['rank']} on {s['node']} {s['why']}" for s in hang["suspects"])
        or f"nobody named ({hang['verdict']})") + f". Stacks of the ranks still running: "
        f"{hang['dumps']}/") if hang and hang.get("trigger") else ""
    raise LaunchError(f"run {run.run_id} failed: {failed} {how} first; the other nodes were "
                      f"stopped. Last lines from {failed} (training processes first, then "
                      f"torchrun):\n    {tail}{held}\nFull logs: {run.path}/")
