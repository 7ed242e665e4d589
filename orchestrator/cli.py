"""Command line: `python -m orchestrator VERB ...`.

Each command lives in its own module with a `register(subparsers)` function that
adds its parser and sets `func`; add new modules to COMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .errors import ClusterError

COMMANDS = (
    "orchestrator.sandbox.cli",
    "orchestrator.data",
    "orchestrator.preflight",
    "orchestrator.train",
    "orchestrator.attach",
    "orchestrator.stop",
    "orchestrator.diagnose",
    "orchestrator.runlogs",
    "orchestrator.provision",
    "orchestrator.wheelhouse",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator",
        description="Provision a PyTorch training cluster over SSH and run jobs on it.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `... | head`: the reader left. Say nothing more on stdout (a run that had
        # started was stopped and recorded by train itself).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print("stopped: the output pipe was closed", file=sys.stderr)
        return 141
