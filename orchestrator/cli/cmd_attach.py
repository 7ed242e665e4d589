"""`attach RUN`: follow a running (e.g. detached) run's logs live, from the start or the
last lines, and exit with the run's status when it ends. Ctrl-C only stops following:
the run goes on (the nodes supervise it); `stop RUN` stops it."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..run.lifecycle import attach_run
from . import values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attach", help="follow a run's logs live until it ends",
                       description="Stream every node's log of RUN, prefixed like train, "
                       "and exit with the run's exit status when it ends. Ctrl-C detaches "
                       "without stopping the run.")
    p.add_argument("run", type=values.run_id, help="run id (see `python -m orchestrator runs`)")
    p.add_argument("--tail", type=values.whole(0, "lines"), metavar="N",
                   help="start with the last N lines of each node (default: from the start)")
    values.add_runs_dir(p)
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    return attach_run(Path(args.runs_dir), args.run, args.tail)
