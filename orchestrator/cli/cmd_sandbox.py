"""`python -m orchestrator sandbox up|status|down|list|share-stall`."""

from __future__ import annotations

import argparse
import json

from ..sandbox import cluster, share
from . import values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sandbox", help="a local cluster of real Debian 12 containers",
                       description="Create, inspect and remove local sandbox clusters: "
                       "Debian 12 containers with systemd and sshd, reachable over SSH "
                       "like servers.")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    v = verbs.add_parser("up", help="create and start a sandbox cluster")
    v.add_argument("--nodes", type=int, default=2, help="training nodes (default 2)")
    v.add_argument("--outsiders", type=int, default=0,
                   help="extra containers on the same network that are not cluster "
                        "members (for firewall tests)")
    v.add_argument("--bastion", action="store_true",
                   help="one more container, 'bastion': the nodes refuse SSH from this "
                        "machine and the ssh_config jumps through the bastion")
    v.add_argument("--slurm", action="store_true",
                   help="the inventories say cluster_scheduler: slurm: site.yml provisions "
                        "Slurm (with 2 fake GPUs per node, a test double) and train can "
                        "run through its queue")
    v.add_argument("--users", default="",
                   help="comma-separated researchers to add to alice (sudo) and bob: login "
                        "users without sudo, each with an inventory and ssh_config as bob's "
                        "(default: none)")
    v.add_argument("--name", default="sandbox", type=values.text("a sandbox name"),
                   help="sandbox name (default: sandbox)")
    v.add_argument("--json", action="store_true", help="print the result as JSON")
    v.set_defaults(func=_up)

    v = verbs.add_parser("status", help="nodes, addresses, state, inventories, ssh_config")
    v.add_argument("--name", default="sandbox", type=values.text("a sandbox name"))
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=_status)

    v = verbs.add_parser("down", help="remove the containers, network and keys of a sandbox")
    v.add_argument("--name", default="sandbox", type=values.text("a sandbox name"))
    v.set_defaults(func=_down)

    v = verbs.add_parser("share-stall", help="block every access to the share for a while, "
                         "as an NFS mount does when its server stalls",
                         description="Stop the FUSE daemons that serve the sandbox's share "
                         "to its nodes for SECONDS: every access to the share on those "
                         "nodes blocks meanwhile. Returns once the share answers again.")
    v.add_argument("--name", default="sandbox", type=values.text("a sandbox name"))
    v.add_argument("--seconds", type=float, required=True)
    v.add_argument("--nodes", help="comma-separated nodes (default: every training node)")
    v.set_defaults(func=_share_stall)

    v = verbs.add_parser("list", help="names of the sandboxes on this machine")
    v.set_defaults(func=lambda a: print("\n".join(cluster.list_names())) or 0)


def _print_status(info: dict) -> None:
    print(f"sandbox {info['name']}  subnet {info['subnet']}  (this machine is "
          f"{info['gateway']} there)")
    for user, u in info["users"].items():
        print(f"  {user + (' (sudo)' if u['sudo'] else ' (no sudo)') + ':':<16} "
              f"inventory {u['inventory']}")
        print(f"  {'':<16} ssh -F {u['ssh_config']} node0")
    print(f"  ssh key:         {info['key']}")
    print(f"  scheduler:       {'slurm' if info['slurm'] else 'none'}")
    print(f"  share:           {info['share']}")
    if info["bastion"]:
        print(f"  bastion:         {info['bastion']['address']} (the only way in: the nodes "
              "refuse SSH from this machine)")
    print(f"  {'NODE':<12} {'ADDRESS':<16} {'STATE':<10} CONTAINER")
    rows = info["nodes"] + ([dict(info["bastion"], outsider=False)] if info["bastion"] else [])
    for n in rows:
        name = n["name"] + (" (outsider)" if n["outsider"] else "")
        print(f"  {name:<12} {n['address']:<16} {n['state']:<10} {n['container']}")


def _share_stall(args) -> int:
    if args.seconds <= 0:
        raise SystemExit(f"--seconds {args.seconds:g}: give a number of seconds above 0")
    nodes = [n for n in (args.nodes or "").split(",") if n]
    stalled = share.stall(cluster.load(args.name), args.seconds, nodes or None)
    print(f"sandbox {args.name}: the share stalled {args.seconds:g} s on "
          f"{', '.join(stalled)}; it answers again")
    return 0


def _up(args) -> int:
    log = (lambda *_: None) if args.json else print
    users = tuple(u for u in args.users.split(",") if u)
    cluster.up(args.name, args.nodes, args.outsiders, log=log, bastion=args.bastion,
               slurm=args.slurm, users=users)
    info = cluster.status(args.name)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_status(info)
        print(f"\nProvision it: ansible-playbook site.yml -i {info['inventory']}")
    return 0


def _status(args) -> int:
    info = cluster.status(args.name)
    print(json.dumps(info, indent=2)) if args.json else _print_status(info)
    return 0


def _down(args) -> int:
    cluster.down(args.name)
    return 0
