"""`preflight`: check every node before a run (orchestrator/checks/preflight.py); the node
selection options the verbs share."""

from __future__ import annotations

import argparse

from .. import defaults
from ..checks.preflight import print_report, run_preflight
from ..cluster.inventory import Cluster, load_cluster
from . import values


def add_selection_args(p: argparse.ArgumentParser) -> None:
    values.add_inventory(p)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--nodes", type=int, help="use the first N nodes of train_nodes")
    group.add_argument("--hosts", type=values.text("inventory names separated by commas"),
                       help="use these nodes, by inventory name: a,b")


def add_python_env_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--python-env", metavar="NAME",
                   type=values.text("the name of one of your environments (env create)"),
                   help="check your own environment NAME (env create) instead of the "
                   "cluster's")


def selected(args: argparse.Namespace) -> Cluster:
    """The nodes add_selection_args chose, with the environment add_python_env_arg named."""
    cluster = load_cluster(args.inventory).select(args.nodes, args.hosts)
    return cluster.with_user_env(getattr(args, "python_env", None))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preflight", help="check that the nodes are ready to train together",
                       description="SSH, identical environments, torch, GPUs, shared path, "
                       "master port, name resolution and clocks, and who else uses the "
                       "nodes (another run, any user's; a process on a GPU), on every node "
                       "at once.")
    add_selection_args(p)
    add_python_env_arg(p)
    p.add_argument("--master-port", type=values.port(values.LEAST_MASTER_PORT),
                   help="port to check on node 0 (default: cluster_rendezvous_port, else "
                   f"{defaults.RENDEZVOUS_PORT})")
    p.add_argument("--share-gpus", action="store_true",
                   help="a node in use by another run or GPU process is a warning, not a "
                   "problem")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    cluster = selected(args)
    report = run_preflight(cluster, args.master_port, share_gpus=args.share_gpus)
    print_report(report)
    return 1 if report.problems else 0
