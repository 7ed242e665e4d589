"""Shell completion of the command line (argcomplete, for bash and zsh): the verbs and
their options from the parsers themselves, and the values a user would otherwise look
up: run ids (from the verb's --runs-dir) and the inventory's hosts (from its -i)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import argcomplete

from .. import defaults

COMPLETING = "_ARGCOMPLETE"   # argcomplete's variable: set when the shell asks
RUN_ARGS = {"run"}
HOST_ARGS = {"node", "host", "hosts"}   # hosts: a,b (train's options declare their own)


def run_ids(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """The recorded runs of the verb's --runs-dir, newest first."""
    from ..record.rundir import list_runs
    root = Path(getattr(parsed_args, "runs_dir", None) or defaults.RUNS_DIR)
    return [r.run_id for r in reversed(list_runs(root)) if r.run_id.startswith(prefix)]


def hosts(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """The inventory's nodes (the verb's -i); after a comma, the list so far and one more."""
    from ..cluster.inventory import load_cluster
    try:
        names = load_cluster(Path(getattr(parsed_args, "inventory", None)
                                  or defaults.INVENTORY)).names
    except Exception:  # noqa: BLE001 - no inventory to read: nothing to offer
        return []
    done, _comma, last = prefix.rpartition(",")
    given = set(done.split(",")) if done else set()
    lead = f"{done}," if done else ""
    return [lead + n for n in names if n.startswith(last) and n not in given]


def attach(parser: argparse.ArgumentParser) -> None:
    """Give every verb's run and host arguments their completer."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                attach(child)
        elif action.dest in RUN_ARGS:
            action.completer = run_ids  # type: ignore[attr-defined]
        elif action.dest in HOST_ARGS:
            action.completer = hosts  # type: ignore[attr-defined]


def complete(parser: argparse.ArgumentParser) -> None:
    """When the shell asks (argcomplete's variables set), print the completions and
    exit; otherwise nothing."""
    attach(parser)
    argcomplete.autocomplete(parser)


def script(shell: str) -> str:
    """The script that makes SHELL complete `clustertrain`."""
    return argcomplete.shellcode(["clustertrain"], shell=shell)
