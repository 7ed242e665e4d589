"""Command line: `python -m orchestrator VERB ...`.

Each verb is a thin module here, `cmd_<verb>.py`: `register(subparsers)` adds its parser
and sets `func`, which parses the arguments into the core's request, calls the core
(orchestrator/<module>.py: preflight, train, stop, diagnose, ...) and prints. Add new
modules to COMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..errors import ClusterError

COMMANDS = (
    "orchestrator.cli.cmd_sandbox",
    "orchestrator.cli.cmd_data",
    "orchestrator.cli.cmd_preflight",
    "orchestrator.cli.cmd_train",
    "orchestrator.cli.cmd_attach",
    "orchestrator.cli.cmd_stop",
    "orchestrator.cli.cmd_diagnose",
    "orchestrator.cli.cmd_doctor",
    "orchestrator.cli.cmd_runs",
    "orchestrator.cli.cmd_provision",
    "orchestrator.cli.cmd_wheelhouse",
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
