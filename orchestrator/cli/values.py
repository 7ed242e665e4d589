"""Argument types the verbs share: each refuses, as argparse's error (exit 2, with the
verb's usage), a value that is wrong on its face, before the verb runs: an empty text
(never taken for "not given"), a runs directory that is a file (never read as "no
runs"), a run id that is a path (never read outside the runs directory), a port out of
range, a count below its least, a date in the future, two nodes where one is meant."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path

from .. import defaults
from ..config.options import Declared, declared
from ..errors import ClusterError
from ..record.rundir import check_run_id
from ..run.spec import RunSpec

DATE_FORMS = "YYYY-MM-DD or YYYY-MM-DDTHH:MM (local time)"
LEAST_MASTER_PORT = 1024   # a master port, as train's --master-port (run/spec.py)


def text(what: str) -> Callable[[str], str]:
    """The type of an option whose value is WHAT, not empty."""
    def check(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"{value!r} is empty; give {what}")
        return value
    return check


def path(what: str) -> Callable[[str], Path]:
    """The type of an option whose value is a path, WHAT, not empty (never taken for the
    current directory)."""
    def check(value: str) -> Path:
        return Path(text(what)(value))
    return check


inventory = text("an Ansible inventory file (the one site.yml uses)")


def shared(name: str) -> Declared:
    """Train's option NAME (run/spec.py's RunSpec), where its flags, help and default are
    declared: the other verbs that take it take it as declared there."""
    return next(d for d in declared(RunSpec) if d.name == name)


def add_inventory(p: argparse.ArgumentParser, default: str | None = str(defaults.INVENTORY),
                  help: str | None = None) -> None:
    """-i/--inventory, as train declares it: DEFAULT None where the verb finds one of its
    own (a run's, a job's), with a HELP that says so."""
    d = shared("inventory")
    p.add_argument(*sorted(d.option.flags, key=len), type=inventory, default=default,
                   help=help or d.option.help)


def add_runs_dir(p: argparse.ArgumentParser, default: str | None = str(defaults.RUNS_DIR),
                 help: str | None = None) -> None:
    """--runs-dir, as train declares it."""
    d = shared("runs_dir")
    p.add_argument(d.option.label, type=runs_dir, default=default, help=help or d.option.help)


def runs_dir(value: str) -> str:
    """The type of --runs-dir: a directory, or a path where none is yet."""
    text("the directory the runs are recorded in")(value)
    if Path(value).exists() and not Path(value).is_dir():
        raise argparse.ArgumentTypeError(
            f"{value} is not a directory; give the directory the runs are recorded in "
            f"(default: {defaults.RUNS_DIR})")
    return value


def run_id(value: str) -> str:
    """The type of a verb's RUN: a run's id, the name of its record in --runs-dir (never
    a path: '..', '/', ...)."""
    try:
        return check_run_id(value)
    except ClusterError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def node(why: str = "") -> Callable[[str], str]:
    """The type of an option whose value is one node's inventory name (WHY: what one
    node is for, said when the value names more)."""
    def check(value: str) -> str:
        text("a node's inventory name")(value)
        names = [n for n in re.split(r"[,\s]+", value) if n]
        if len(names) != 1 or names[0] != value:
            raise argparse.ArgumentTypeError(
                f"{value!r} is not one node's inventory name{'; ' + why if why else ''}: "
                f"give one (e.g. {names[0] if names else 'node0'})")
        return value
    return check


def port(least: int = 1) -> Callable[[str], int]:
    """The type of an option whose value is a port, LEAST to 65535."""
    def check(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a port; choose a port in "
                                             f"{least}-65535") from None
        if not least <= number <= 65535:
            raise argparse.ArgumentTypeError(f"{value}: choose a port in {least}-65535")
        return number
    return check


def whole(least: int, what: str) -> Callable[[str], int]:
    """The type of an option whose value is a whole number of WHAT, LEAST or more."""
    def check(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = least - 1
        if number < least:
            raise argparse.ArgumentTypeError(f"{value}: give a number of {what}, {least} or "
                                             "more")
        return number
    return check


def past(value: str, now: float | None = None) -> float:
    """VALUE, a date or a time (local), as seconds since the epoch; ValueError saying
    why unless it is one, and not after NOW."""
    try:
        at = datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise ValueError(f"{value!r}: not a date; give {DATE_FORMS}") from None
    now = time.time() if now is None else now
    if at > now:
        raise ValueError(f"{value} is in the future (today is {date.fromtimestamp(now)}); "
                         "give a date up to today")
    return at


def since(value: str) -> str:
    """The type of --since: a date or time not after now (`past`)."""
    try:
        past(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value
