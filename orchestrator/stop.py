"""`stop RUN`: stop a running job on all its nodes, from any terminal.

Only that run's processes are signalled (its recorded process group and their
descendants, once checked to still carry the run's id); other runs on the same nodes keep
running. A run is stopped by the user it runs as: another user's stop is refused before
any node is touched (and the nodes would refuse it too: the job's record is in its
user's private directory, and its processes are that user's).
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from . import ssh
from .errors import ClusterError
from .fanout import each
from .inventory import load_cluster
from .runs import DEFAULT_RUNS_DIR, check_owner, open_run
from .teardown import DEFAULT_GRACE, StopResult, stop_job
from .train import check_grace

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stop", help="stop a running job on every node",
                       description="SIGTERM to the run's process group on each node, "
                       "SIGKILL after the grace period. Other runs are not touched.")
    p.add_argument("run", help="run id (see `python -m orchestrator runs`)")
    p.add_argument("--runs-dir", default=str(DEFAULT_RUNS_DIR))
    p.add_argument("-i", "--inventory",
                   help="connect with this inventory (default: the one the run used)")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE,
                   help="seconds between SIGTERM and SIGKILL (default: %(default)s)")
    p.set_defaults(func=_main)


def stop_run(runs_dir: Path, run_id: str, grace: float = DEFAULT_GRACE,
             inventory: str | None = None) -> list[StopResult]:
    if not RUN_ID.match(run_id):
        raise ClusterError(f"{run_id!r} is not a run id; see `python -m orchestrator runs`")
    check_grace(grace)
    run = open_run(runs_dir, run_id)
    info = run.info()
    cluster = load_cluster(inventory or info["inventory"]).select(hosts=",".join(info["nodes"]))
    check_owner(cluster.nodes, info, "stop it. Nothing was signalled")

    def one(spec):
        conn = ssh.connect(spec.name, spec.ssh)
        try:
            return stop_job(conn, spec.python, run_id, grace)
        finally:
            conn.close()

    (run.path / "stop-requested").write_text(f"{time.time()}\n")

    return list(each(cluster.nodes, one, lambda s: s.name).values_or_raise().values())


def _main(args: argparse.Namespace) -> int:
    results = stop_run(Path(args.runs_dir), args.run, args.grace, args.inventory)
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
