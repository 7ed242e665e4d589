"""`stop RUN`: stop a running run on all its nodes, from any terminal.

Only that run's processes are signalled (its recorded process group and their
descendants, once checked to still carry the run's id: node/terminate.py, the one stop); other
runs on the same nodes keep running. A run is stopped by the user it runs as: another
user's stop is refused before any node is touched (and the nodes would refuse it too: the
job's record is in its user's private directory, and its processes are that user's).
"""

from __future__ import annotations

import time
from pathlib import Path

from .. import defaults
from ..cluster.inventory import load_cluster
from ..node.protocol import STOP_REQUESTED
from ..record.rundir import check_owner, open_run, write_private
from .scheduler import StopResult, scheduler_for, slurm_job_of
from .spec import check_grace


def stop_run(runs_dir: Path, run_id: str, grace: float = defaults.GRACE,
             inventory: str | None = None) -> list[StopResult]:
    check_grace(grace)
    run = open_run(runs_dir, run_id)   # the id checked whole: never a path
    info = run.info()
    if info.get("queued") and not run.ended:   # waiting in Slurm's queue: cancel its job
        from .allocation import cancel_queued
        cancel_queued(run, info, load_cluster(inventory or info["inventory"]))
        return []
    cluster = load_cluster(inventory or info["inventory"]).select(hosts=",".join(info["nodes"]))
    check_owner(cluster.nodes, info, "stop it. Nothing was signalled")
    write_private(run.path / STOP_REQUESTED, f"{time.time()}\n")
    return list(scheduler_for(slurm_job_of(info)).cancel(list(cluster.nodes), run_id, grace)
                .values())
