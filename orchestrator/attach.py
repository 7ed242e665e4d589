"""`attach RUN`: follow a running (e.g. detached) run's logs live, from the start or the
last lines, and exit with the run's status when it ends. Ctrl-C only stops following:
the run goes on (the nodes supervise it); `stop RUN` stops it."""

from __future__ import annotations

import argparse
from pathlib import Path

from .command import NodeCommand
from .errors import ClusterError
from .inventory import load_cluster
from .job import Job
from .records import settle
from .runs import DEFAULT_RUNS_DIR, RunStatus, open_run
from .ssh import connect_all
from .train import _conclude, make_summary


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attach", help="follow a run's logs live until it ends",
                       description="Stream every node's log of RUN, prefixed like train, "
                       "and exit with the run's exit status when it ends. Ctrl-C detaches "
                       "without stopping the run.")
    p.add_argument("run", help="run id (see `python -m orchestrator runs`)")
    p.add_argument("--tail", type=int, metavar="N",
                   help="start with the last N lines of each node (default: from the start)")
    p.add_argument("--runs-dir", default=str(DEFAULT_RUNS_DIR))
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    if args.tail is not None and args.tail < 0:
        raise ClusterError(f"--tail {args.tail}: give a number of lines, 0 or more")
    run = open_run(Path(args.runs_dir), args.run)
    info = run.info()
    records = info.get("node_commands")
    if not records:
        raise ClusterError(f"run {args.run} was started by an older version and cannot be "
                           "attached to; see `logs` instead")
    summary = run.summary()
    if summary is not None:
        print(f"run {args.run} has ended ({summary['status']}); its logs: "
              f"python -m orchestrator logs {args.run}")
        return 0 if summary["status"] == RunStatus.SUCCEEDED else 1
    cluster = load_cluster(info["inventory"]).select(hosts=",".join(info["nodes"]))
    commands = [NodeCommand.from_record(records[n]) for n in cluster.names]
    clients = connect_all(list(cluster.nodes))
    try:
        if args.tail is None:  # the whole log again: the local copy starts over
            for name in cluster.names:
                run.log(name).write_text("")
        job = Job(run, list(zip(cluster.nodes, commands, strict=True)), clients)
        job.tail = args.tail
        result = job.run(attached=False)
    finally:
        for conn in clients.values():
            conn.close()
    if result.interrupted:
        return 130
    summary = settle(run) or make_summary(info, commands, cluster.names, result, 0.0, run)
    if run.summary() is None:
        run.write_summary(summary)
    return _conclude(run, result, summary)
