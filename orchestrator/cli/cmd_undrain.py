"""`undrain NODE`: return a drained node to Slurm (an admin, with sudo on the nodes)."""

from __future__ import annotations

import argparse

from .. import defaults
from ..cluster.inventory import load_cluster
from ..run.drain import undrain


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("undrain", help="return a drained node to Slurm (admin)",
                       description="Return NODE to service in Slurm once it is fixed (a run "
                       "that lost it drained it, naming why). Needs sudo on the nodes.")
    p.add_argument("node", help="the node's inventory name (also its Slurm name)")
    p.add_argument("-i", "--inventory", default=str(defaults.INVENTORY))
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    state = undrain(load_cluster(args.inventory), args.node)
    print(f"{args.node} is back in service ({state or 'state unknown'})")
    return 0
