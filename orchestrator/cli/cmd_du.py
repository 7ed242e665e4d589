"""`du [--all]`: the share's bytes by user and kind (checkpoints, run records, data,
wheelhouses, other), and its free space; node/du.py says how a file is counted."""

from __future__ import annotations

import argparse
import json

from ..cluster.inventory import load_cluster
from ..cluster.share_usage import share_usage
from ..node.answers import DuAnswer
from ..node.du import KINDS
from ..node.space import size
from . import values


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("du", help="what fills the share, by user and kind",
                       description="The share's bytes by user (each file counts for its "
                       "owner) and by kind: checkpoints, run records (checkpoints/USER/"
                       ".clustertrain), data, wheelhouses, other; with its free space. "
                       "Another user's private directories are listed as not read; an "
                       "admin sees everything with --all (as root, through sudo).")
    d.add_argument("--all", action="store_true", dest="everyone",
                   help="read every user's directories as root (sudo on the first node)")
    d.add_argument("--json", action="store_true", help="print the figures as JSON")
    values.add_inventory(d)
    d.set_defaults(func=_du)


def _du(args: argparse.Namespace) -> int:
    found = share_usage(load_cluster(args.inventory), args.everyone)
    if args.json:
        print(json.dumps(found.to_json(), indent=2))
        return 0
    for line in table(found):
        print(line)
    return 0


def table(found: DuAnswer) -> list[str]:
    """The figures as a person reads them: the share's room, a row per user (the biggest
    first), then what was not read."""
    lines = []
    if found.total:
        lines.append(f"the share {found.share}: {size(found.free or 0)} free of "
                     f"{size(found.total)}")
    users = sorted(found.users.items(), key=lambda u: -sum(u[1].values()))
    lines.append(f"{'USER':<12}" + "".join(f"{k.upper():>13}" for k in KINDS)
                 + f"{'TOTAL':>13}")
    for user, kinds in users:
        lines.append(f"{user:<12}" + "".join(f"{size(kinds.get(k, 0)):>13}" for k in KINDS)
                     + f"{size(sum(kinds.values())):>13}")
    for u in found.unread:
        lines.append(f"not read: {u.path} (owned by {u.owner}): {u.why}; an admin "
                     "sees it with du --all")
    return lines
