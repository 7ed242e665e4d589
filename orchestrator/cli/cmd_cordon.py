"""`cordon [NODE --why TEXT]`, `uncordon NODE`: the nodes every user's runs keep out (the
share's record, and on Slurm the node's drain). Who may lift a cordon: node/cordon.py."""

from __future__ import annotations

import argparse
import sys

from ..cluster.drain import cordon_record, keep_out, uncordon
from ..cluster.inventory import load_cluster
from ..errors import ClusterError, InputError
from . import values

WHO_LIFTS = ("Any user may cordon any node; only the cordon's author or an admin (a member "
             "of the inventory's cluster_admin_group, default sudo) may lift it: another "
             "user's uncordon is refused before anything is written, and a file written "
             "anyway lifts nothing. An event's author and time are its file's owner and "
             "mtime on the share, never what the file says; one dated in the future is "
             "ignored (the list says so).")


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("cordon", help="keep a node out of every user's runs, or list those",
                       description="Without NODE: the nodes cordoned now, with why, by whom "
                       "and since when. With NODE: cordon it (every user's preflight refuses "
                       "it; on Slurm it is drained too) until `uncordon NODE`. Runs that "
                       "lose a node, and doctor, cordon it themselves. " + WHO_LIFTS)
    c.add_argument("node", nargs="?", type=values.node(), help="the node's inventory name")
    c.add_argument("--why", type=values.text("the reason"),
                   help="the reason every refusal will name (with NODE: required)")
    values.add_inventory(c)
    c.set_defaults(func=_cordon)
    u = sub.add_parser("uncordon", aliases=["undrain"],
                       help="return a cordoned (and drained) node to service",
                       description="Return NODE to service once it is fixed: the share's "
                       "record says so, and on a Slurm cluster Slurm takes it back. A clean "
                       "`doctor` on the node does the same, as its user, by the same rule. "
                       + WHO_LIFTS)
    u.add_argument("node", type=values.node(),
                   help="the node's inventory name (also its Slurm name)")
    values.add_inventory(u)
    u.set_defaults(func=_uncordon)


def _cordon(args: argparse.Namespace) -> int:
    if args.node is None and args.why is not None:
        raise InputError(f"cordon --why {args.why!r}: --why goes with a node to cordon "
                         "(cordon NODE --why TEXT); without NODE, cordon lists the cordoned "
                         "nodes and takes no reason")
    if args.node is not None and not args.why:
        raise InputError(f"cordon {args.node}: say why with --why TEXT (every run it "
                         "refuses names it)")
    cluster = load_cluster(args.inventory)
    if args.node is None:
        listed = cordon_record(cluster)
        found = listed.cordoned
        if not found:
            print("no node is cordoned")
        for node, event in sorted(found.items()):
            others = [by for by in event.get("held_by") or [] if by != event.get("by")]
            print(f"{node:<12} since {event.get('since')} by {event.get('by')}: "
                  f"{event.get('why') or '-'}"
                  + (f" (also held by {', '.join(others)})" if others else ""))
        for file in listed.ignored:
            print(f"ignored: {file.get('file')} by {file.get('by')}: {file.get('why')}",
                  file=sys.stderr)
        return 0
    if args.node not in cluster.names:
        raise ClusterError(f"cordon {args.node}: not a node of {cluster.inventory} "
                           f"({', '.join(cluster.names)})")
    kept = keep_out(cluster, {args.node: args.why}, None)
    return 0 if args.node in kept.cordoned else 1


def _uncordon(args: argparse.Namespace) -> int:
    state = uncordon(load_cluster(args.inventory), args.node)
    print(f"{args.node} is back in service" + (f" (Slurm: {state})" if state else ""))
    return 0
