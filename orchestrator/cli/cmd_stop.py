"""`stop RUN`: stop a run on every node (orchestrator/run/stop.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import defaults
from ..record.rundir import open_run
from ..run.settle import current_attempt
from ..run.spec import check_grace
from ..run.stop import stop_run
from . import values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stop", help="stop a running job on every node",
                       description="SIGTERM to the run's process group on each node, "
                       "SIGKILL after the grace period. Other runs are not touched.")
    p.add_argument("run", type=values.run_id, help="run id (see `python -m orchestrator runs`)")
    values.add_runs_dir(p)
    values.add_inventory(p, None, "connect with this inventory (default: the one the run "
                         "used)")
    p.add_argument("--grace", type=float, default=defaults.GRACE,
                   help="seconds between SIGTERM and SIGKILL (default: %(default)s)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    check_grace(args.grace)   # before a live run is settled through its nodes
    # A run whose node failed and that recovered: its attempt now.
    attempt = current_attempt(open_run(Path(args.runs_dir), args.run))
    attempt.info(*(() if args.inventory else ("inventory",)))   # its nodes are asked through it
    if attempt.run_id != args.run:
        print(f"run {args.run} recovered from a failed node and runs as {attempt.run_id} now")
        args.run = attempt.run_id
    results = stop_run(Path(args.runs_dir), args.run, args.grace, args.inventory)
    if not results:
        print(f"run {args.run} was waiting in Slurm's queue: its job was cancelled; nothing "
              "had started")
        return 0
    left = False
    for r in results:
        if not r.found:
            print(f"{r.node}: no job of run {args.run} is recorded for {r.user} on this node")
        elif r.stale:
            print(f"{r.node}: the recorded process group of run {args.run} is another "
                  "process now; nothing was signalled")
        elif not r.was_running:
            print(f"{r.node}: run {args.run} was not running")
        elif r.left:
            left = True
            print(f"{r.node}: processes {r.left} are still alive after SIGKILL")
        else:
            extra = f" ({len(r.killed)} needed SIGKILL)" if r.killed else ""
            print(f"{r.node}: stopped{extra}")
    return 1 if left else 0
