"""`train`: preflight, sync the code, start torchrun on every node, stream logs, tear down.

    python -m orchestrator train --nodes 2 ddp.py -- --epochs 3
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from .command import NodeCommand, TorchrunOptions, parse_env
from .errors import LaunchError
from .inventory import load_cluster
from .job import Job, JobResult
from .preflight import (add_selection_args, print_report, raise_if_blocked, run_preflight)
from .probe import release_port
from .runs import DEFAULT_RUNS_DIR, RunDir, code_revision, iso, new_run_id
from .runner import REPO_ROOT
from .sync import sync_code
from .teardown import DEFAULT_GRACE

DEFAULT_WORKDIR = REPO_ROOT / "train"
DEFAULT_SCRIPT = "train.py"


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


def parse_request(args: argparse.Namespace) -> TrainRequest:
    workdir = Path(args.workdir).expanduser()
    if not workdir.is_dir():
        raise LaunchError(f"--workdir {workdir}: no such directory; point --workdir at the "
                          "directory that holds your training code")
    script, rest = args.script, list(args.script_args or [])
    if script.startswith("-"):  # `train --nodes 2 -- --epochs 3`: no script named
        script, rest = DEFAULT_SCRIPT, [script, *rest]
    if Path(script).is_absolute():
        try:
            script = str(Path(script).resolve().relative_to(workdir.resolve()))
        except ValueError:
            raise LaunchError(f"script {args.script} is outside --workdir {workdir}; only "
                              "the work directory is copied to the nodes") from None
    if not (workdir / script).is_file():
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
    return TrainRequest(workdir, script, tuple(rest), parse_env(args.env), nproc,
                        args.master_port,
                        TorchrunOptions(max_restarts=args.max_restarts,
                                        rdzv_backend=args.rdzv_backend,
                                        extra=tuple(args.torchrun_arg or ())))


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
    p.add_argument("--workdir", default=str(DEFAULT_WORKDIR),
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
    p.add_argument("--dry-run", action="store_true",
                   help="check the nodes and print the exact per-node commands; start nothing")
    p.add_argument("script", nargs="?", default=DEFAULT_SCRIPT,
                   help="training script, relative to --workdir (default: %(default)s)")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="arguments for the script (after --)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    request = parse_request(args)
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
                        torchrun=facts.python_env["torchrun"], home=str(facts.home),
                        script=request.script, script_args=request.script_args,
                        env={"CLUSTERTRAIN_BACKEND": report.backend, **request.env},
                        options=request.options)
            for i, facts in enumerate(report.facts)]
        facts_by = {f.node.name: f for f in report.facts}
        if args.dry_run:
            for spec, cmd in zip(cluster.nodes, commands):
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
            "master": {"addr": commands[0].master_addr, "port": commands[0].master_port},
            "commands": {s.name: c.torchrun_argv() for s, c in zip(cluster.nodes, commands)},
            "code_revision": code_revision(request.workdir),
            "fingerprint": report.fingerprint,
        }
        run.create(info)
        print(f"run {run_id}: syncing {request.workdir.resolve()} to {len(cluster.nodes)} "
              "node(s)", flush=True)
        synced = sync_code(cluster, request.workdir, run_id)
        print(f"run {run_id}: code synced in {synced.seconds:.1f} s; starting torchrun on "
              f"{', '.join(cluster.names)} (master {commands[0].master_addr}:"
              f"{commands[0].master_port})", flush=True)
        job = Job(run, list(zip(cluster.nodes, commands)), report.clients, grace=args.grace)
        result = job.run()
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


def make_summary(info: dict, commands: list[NodeCommand], names: list[str],
                 result: JobResult, sync_seconds: float, run: RunDir) -> dict:
    stop_requested = (run.path / "stop-requested").exists()
    status = ("succeeded" if result.ok else "stopped" if stop_requested
              else "interrupted" if result.interrupted else "failed")
    return {
        **info,
        "status": status,
        "start": iso(result.started), "end": iso(result.ended),
        "duration_s": round(result.ended - result.started, 3),
        "sync_s": round(sync_seconds, 3),
        "nodes": [{"name": n, "node_rank": c.node_rank, "nproc": c.nproc,
                   "exit_code": result.outcomes[n].exit_code,
                   "end_reason": result.outcomes[n].reason,
                   "log": str(run.log(n))} for n, c in zip(names, commands)],
        "exit_codes": {n: result.outcomes[n].exit_code for n in names},
        "first_failed": result.first_failed,
        "command": {n: shlex.join(c.torchrun_argv()) for n, c in zip(names, commands)},
    }


def _conclude(run: RunDir, result: JobResult, summary: dict) -> int:
    print(f"run {run.run_id}: {summary['status']} after {summary['duration_s']:.1f} s; "
          f"logs and summary in {run.path}/", flush=True)
    if result.ok:
        return 0
    if summary["status"] in ("interrupted", "stopped"):
        print(f"run {run.run_id}: {summary['status']}; the job was stopped on every node",
              file=sys.stderr)
        return 130 if summary["status"] == "interrupted" else 1
    failed = result.first_failed or next(
        (n for n, o in result.outcomes.items() if o.failed), None)
    outcome = result.outcomes.get(failed) if failed else None
    how = ("lost its connection" if outcome and outcome.reason == "lost"
           else f"exited with code {outcome.exit_code}" if outcome else "failed")
    lines = list(outcome.last_worker_lines) if outcome else []
    lines += [line for line in (outcome.last_lines if outcome else [])
              if "/rank" not in line.split(" | ")[0]]
    tail = "\n    ".join(lines) if lines else "(no output)"
    raise LaunchError(f"run {run.run_id} failed: {failed} {how} first; the other nodes were "
                      f"stopped. Last lines from {failed} (training processes first, then "
                      f"torchrun):\n    {tail}\nFull logs: {run.path}/")
