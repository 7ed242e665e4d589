"""Argument types the verbs share: each refuses, as argparse's error (exit 2, with the
verb's usage), a value that is wrong on its face, before the verb runs: an empty text
(never taken for "not given") and a runs directory that is a file (never read as "no
runs")."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from .. import defaults


def text(what: str) -> Callable[[str], str]:
    """The type of an option whose value is WHAT, not empty."""
    def check(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"{value!r} is empty; give {what}")
        return value
    return check


def runs_dir(value: str) -> str:
    """The type of --runs-dir: a directory, or a path where none is yet."""
    text("the directory the runs are recorded in")(value)
    if Path(value).exists() and not Path(value).is_dir():
        raise argparse.ArgumentTypeError(
            f"{value} is not a directory; give the directory the runs are recorded in "
            f"(default: {defaults.RUNS_DIR})")
    return value
