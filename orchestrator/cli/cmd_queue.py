"""`queue`: every user's running and waiting jobs on a Slurm cluster, with their GPUs
(orchestrator/cluster/slurm.py words what squeue says)."""

from __future__ import annotations

import argparse
import json

from ..cluster.inventory import load_cluster
from ..cluster.slurm import render_queue, squeue
from . import values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("queue", help="every user's running and waiting jobs (Slurm), with "
                       "their GPUs",
                       description="On a cluster that runs Slurm (cluster_scheduler: slurm): "
                       "every user's running jobs with their GPUs and nodes, then the "
                       "waiting ones in the order Slurm would start them, each with why it "
                       "waits. clustertrain's runs are named by their run id.")
    values.add_inventory(p)
    p.add_argument("--json", action="store_true", help="the jobs as JSON")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    cluster = load_cluster(args.inventory)
    if cluster.scheduler != "slurm":
        print(f"the inventory {cluster.inventory} says cluster_scheduler: "
              f"{cluster.scheduler}: there is no queue; runs start at once (preflight "
              "refuses nodes another run uses). Your runs: python -m orchestrator runs")
        return 0
    jobs = squeue(cluster)
    print(json.dumps(jobs, indent=2) if args.json else render_queue(jobs))
    return 0
