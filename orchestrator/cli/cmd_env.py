"""`env create|list|rm`: a user's own environments on the nodes, without sudo
(orchestrator/provision/userenv.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import defaults
from ..cluster.inventory import check_env_name
from ..provision import userenv
from . import values
from .cmd_preflight import add_selection_args, selected


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="your own environments on the nodes (no sudo needed)",
                       description="Your own Python environment, identical on every node, "
                       "beside the cluster's: made from an environment file (conda format) "
                       "under ~/.clustertrain/envs/ on each node, as you, without sudo; "
                       "`train --python-env NAME` runs in it.")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    v = verbs.add_parser("create", help="realise an environment file on every node",
                         description="Realise FILE as NAME on every chosen node at once: a "
                         "venv (or a conda environment where the cluster has conda) under "
                         "~/.clustertrain/envs/NAME-KEY, KEY a digest of the file and the "
                         "wheelhouse's lock. The same file again changes nothing; a changed "
                         "one makes a new environment and leaves the old one to the runs "
                         "that use it. The nodes' fingerprints must agree at the end.")
    v.add_argument("-f", "--file", required=True, help="the environment file (conda format)")
    v.add_argument("--name", type=values.text("the environment's name"),
                   help="its name (default: the file's name:)")
    v.add_argument("--wheelhouse", metavar="DIR",
                   help="install from this wheelhouse, as the nodes see it (e.g. on the "
                   "share; build it with `python -m orchestrator wheelhouse --env FILE "
                   "--dest DIR`); default: the indexes the nodes reach")
    v.add_argument("--keep", type=int, default=defaults.KEEP_ENVS,
                   help="states of this environment kept on each node: older unused ones "
                   "are removed (default: %(default)s)")
    add_selection_args(v)
    v.set_defaults(func=_create)

    v = verbs.add_parser("list", help="your environments: name, key, nodes, size, last use")
    v.add_argument("--json", action="store_true")
    add_selection_args(v)
    v.set_defaults(func=_list)

    v = verbs.add_parser("rm", help="remove an environment from every node (not while a "
                         "run uses it)")
    v.add_argument("name")
    v.add_argument("--key", help="only this state of it (see `env list`)")
    add_selection_args(v)
    v.set_defaults(func=_rm)


def _create(args: argparse.Namespace) -> int:
    env_file = userenv.EnvFile.read(Path(args.file))
    name = check_env_name(args.name or env_file.name, "--name" if args.name else
                          f"the name: of {args.file}")
    cluster = selected(args)
    created = userenv.create(cluster, env_file, name, args.wheelhouse, args.keep)
    key = next(iter(created.keys))
    print(f"env create {name}: {name}-{key} on {', '.join(created.nodes)} in "
          f"{created.seconds:.1f} s (made on {len(created.made)}, already there on "
          f"{len(created.nodes) - len(created.made)}); run in it: python -m orchestrator "
          f"train --python-env {name} ...")
    return 0


def _list(args: argparse.Namespace) -> int:
    cluster = selected(args)
    states = userenv.list_envs(cluster)
    print(json.dumps([s.to_json() for s in states], indent=2) if args.json
          else userenv.render(states, cluster.names))
    return 0


def _rm(args: argparse.Namespace) -> int:
    removed = userenv.remove(selected(args), args.name, args.key)
    for node, dirs in removed.items():
        print(f"{node}: removed {', '.join(dirs) or 'nothing'}")
    return 0
