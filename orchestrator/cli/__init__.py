"""Command line: `python -m orchestrator VERB ...`.

Each verb is a thin module here, `cmd_<verb>.py`: `register(subparsers)` adds its parser
and sets `func`, which parses the arguments into the core's request, calls the core
(orchestrator/<module>.py: preflight, train, stop, diagnose, ...) and prints. Name each
new verb in VERBS (a command loads its verb's module only).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from ..errors import ClusterError, InputError
from .completion import COMPLETING, complete

# Each verb (aliases too) and its module, in the order help lists them.
VERBS = {
    "sandbox": "cmd_sandbox", "data": "cmd_data", "preflight": "cmd_preflight",
    "train": "cmd_train", "attach": "cmd_attach", "notebook": "cmd_notebook",
    "sweep": "cmd_sweep", "stop": "cmd_stop", "queue": "cmd_queue", "cordon": "cmd_cordon",
    "uncordon": "cmd_cordon", "undrain": "cmd_cordon", "diagnose": "cmd_diagnose",
    "doctor": "cmd_doctor", "du": "cmd_du", "runs": "cmd_runs", "logs": "cmd_runs", "ui": "cmd_ui",
    "provision": "cmd_provision", "wheelhouse": "cmd_wheelhouse", "env": "cmd_env",
    "usage": "cmd_usage", "nodes": "cmd_nodes", "completion": "cmd_completion",
}
COMMANDS = tuple(dict.fromkeys(f"{__name__}.{module}" for module in VERBS.values()))


class Parser(argparse.ArgumentParser):
    """No abbreviated options, here and in every verb (the verbs' parsers are of this
    class too): `--keep 3` is not taken for `--keep-runs 3`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser(verb: str | None = None) -> Parser:
    """The command line's parser: every verb's, or (VERB) only that verb's, which parses
    its arguments, says its help and its errors as the whole parser does. A command that
    names its verb loads only that verb's module: every verb's imports cost each command
    a third of a second."""
    parser = Parser(
        prog="python -m orchestrator",
        description="Provision a PyTorch training cluster over SSH and run jobs on it.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS if verb is None else (f"{__name__}.{VERBS[verb]}",):
        importlib.import_module(module).register(sub)
    _know_yourself(parser)
    return parser


def _verb(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of verb NAME (the top-level parser for anything else)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


def _know_yourself(parser: argparse.ArgumentParser) -> None:
    """Every parser records itself in the namespace (the innermost verb's wins), so that
    an error is said with the usage of the verb that was given."""
    parser.set_defaults(parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _know_yourself(child)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The verb's arguments. An argument the verb does not know is its error, said with
    the verb's own usage (and, where it has one, its hint: `train`'s script options go
    after `--`), not the top-level usage."""
    words = list(sys.argv[1:] if argv is None else argv)
    completing = argv is None and COMPLETING in os.environ
    # The whole parser for help, completion and anything but a verb first (an unknown
    # word's error lists every verb).
    parser = build_parser(words[0] if words and words[0] in VERBS and not completing
                          else None)
    if argv is None:
        complete(parser)   # the shell asking for completions: answered, and exits
    after: list[str] | None = None
    if words and _verb(parser, words[0]).get_default("takes_separator") and "--" in words:
        # Everything after the first `--` is the script's, whatever it looks like
        # (argparse would drop a `--` that follows the script, and with it the line
        # between train's options and the script's).
        at = words.index("--")
        words, after = words[:at], words[at + 1:]
    args, unknown = parser.parse_known_args(words)
    args.after_separator = after
    if unknown:
        verb: argparse.ArgumentParser = args.parser
        hint = getattr(args, "unknown_hint", None)
        verb.error(f"unrecognized arguments: {' '.join(unknown)}"
                   + (f"\n{hint(words[words.index(unknown[0]):])}" if hint else ""))
    return args


def check_utf8(words: list[str]) -> None:
    """InputError naming the first word that is not UTF-8 (a shell passes a Latin-1 file
    name as bytes Python holds as surrogates, which would fail far later, on a node)."""
    for at, word in enumerate(words, 1):
        try:
            word.encode()
        except UnicodeEncodeError as exc:
            raw = word.encode("utf-8", "surrogateescape")
            bad = raw[len(word[:exc.start].encode("utf-8", "surrogateescape"))]
            raise InputError(f"argument {at} ({raw.decode('utf-8', 'backslashreplace')}) "
                             f"holds byte 0x{bad:02x}, which is not UTF-8; give every "
                             "argument (a path, a value) as UTF-8 text") from None


def main(argv: list[str] | None = None) -> int:
    """The verb's exit status: a ClusterError's message and code, 130 on Ctrl-C (even one
    pressed while the verbs load), never a traceback for either."""
    try:
        check_utf8(list(sys.argv[1:] if argv is None else argv))
        args = parse(argv)
        return args.func(args) or 0
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        # Ctrl-C while a module defines a class: Python wraps it ("Error calling
        # __set_name__"), the KeyboardInterrupt its cause.
        if not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `... | head`: the reader left. Say nothing more on stdout (a run that had
        # started was stopped and recorded by train itself).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print("stopped: the output pipe was closed", file=sys.stderr)
        return 141
