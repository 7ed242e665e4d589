"""`provision`: run site.yml with ansible-runner (orchestrator/provision/site.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..provision.site import provision
from . import values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("provision", help="configure the nodes: run site.yml with ansible-runner")
    values.add_inventory(p)
    p.add_argument("--limit", type=values.text("the hosts or groups (an Ansible pattern)"),
                   help="only these hosts/groups (Ansible pattern)")
    p.add_argument("--tags", type=values.text("the tags"), help="only tasks with these tags")
    p.add_argument("--check", action="store_true", help="dry run: report what would change")
    p.add_argument("--playbook", default="site.yml",
                   type=values.text("a playbook, relative to the repository"),
                   help="playbook, relative to the repository (default: %(default)s)")
    p.add_argument("-e", "--extra-vars", action="append", metavar="K=V",
                   help="extra variables for the playbook (repeatable)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    provision(Path(args.inventory), args.limit, args.check, args.tags, args.playbook,
              args.extra_vars)
    return 0
