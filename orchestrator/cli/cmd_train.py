"""`train`: read the run from the command line (and `-f JOB_FILE`) into its spec
(orchestrator/run/spec.py), run it (orchestrator/run/lifecycle.py), exit with its status.
Its options are the spec's option fields (SPEC), each declared once there: the parser is
made from them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..config.kinds import Flag, ListOf, MapOf, Number, Whole
from ..config.options import Option, declared
from ..errors import InputError
from ..run.spec import Given, RunSpec, from_sources, read_job_file
from ..workloads.train import train
from .completion import hosts

SPEC: type = RunSpec     # the spec train reads: its option fields are train's options
GROUPS = {"queue": "through Slurm's queue (an inventory with cluster_scheduler: slurm)",
          "recovery": "recovery from a failed node", "doctor": "doctor before the run"}


def sources(args: argparse.Namespace) -> dict[str, Given]:
    """What the run is given: the job file's values (-f), the command line's over them."""
    given = read_job_file(Path(args.file), SPEC) if getattr(args, "file", None) else {}
    for d in declared(SPEC):
        if not d.option.positional and hasattr(args, d.key):
            given[d.key] = Given(getattr(args, d.key), d.option.label)
    script = getattr(args, "script", None)
    rest = list(getattr(args, "script_args", None) or [])
    check_no_tool_options(args.tool_options, script, rest)
    rest += getattr(args, "after_separator", None) or []   # after `--`: the script's
    if hasattr(args, "module"):  # `-m pkg.mod -- ARGS`: a word after it is an argument
        rest = [*([script] if script else []), *rest]
        given.pop("script", None)
        given["args"] = Given(rest, "the script's arguments")
    elif script is not None and not script.startswith("-"):
        given.pop("module", None)
        given["script"] = Given(script, "the script")
        given["args"] = Given(rest, "the script's arguments")
    elif script is not None or rest:   # `--` and no script: the default script's
        given["args"] = Given(([script] if script else []) + rest, "the script's arguments")
    return given


def check_no_tool_options(ours: frozenset[str], script: str | None, rest: list[str]) -> None:
    """Everything after the script goes to the script, but one of train's own options
    (OURS) there, before any `--`, was surely meant for train: refuse it, saying where it
    goes."""
    if not script or script.startswith("-"):
        return
    for word in rest:
        if word == "--":
            return
        if word.split("=", 1)[0] in ours:
            raise InputError(
                f"{word} comes after the script {script}, where it would be the script's "
                f"argument, but it is an option of train: put it before the script "
                f"(train {word} ... {script}), or after -- to pass it to the script "
                f"(train ... {script} -- {word})")


def unknown_hint(tail: list[str]) -> str:
    """What an option train does not know (TAIL: the words from it on) most likely is:
    the script's."""
    return ("options for the script go after --, e.g. python -m orchestrator train "
            f"--nodes 2 [SCRIPT] -- {' '.join(tail)}")


def register(sub: argparse._SubParsersAction) -> None:
    # Options not given are left out (SUPPRESS): a job file's value then stands.
    p = sub.add_parser("train", help="run a training script on the cluster with torchrun",
                       argument_default=argparse.SUPPRESS,
                       description="Preflight every node, copy the code into a per-run "
                       "snapshot, start torchrun on all nodes at once, stream their logs, "
                       "and stop the job everywhere if one node fails or on Ctrl-C. The run "
                       "can be given as a job file (-f): YAML whose keys are these long "
                       "options with '_' (args: the script's arguments, as a list; env: a "
                       "mapping); options given here override it.")
    p.add_argument("-f", "--file", metavar="JOB_FILE",
                   help="the run as a job file (train --dry-run prints one)")
    p.add_argument("--dry-run", action="store_true", default=False,
                   help="check the nodes and print the exact per-node commands and the run "
                   "as a job file; start nothing")
    places: dict[str, Any] = {"": p, "nodes": p.add_mutually_exclusive_group()}
    positional = {}
    for d in declared(SPEC):
        if d.option.positional:
            positional[d.key] = d.option.help
            continue
        if d.option.group not in places:
            places[d.option.group] = p.add_argument_group(GROUPS[d.option.group])
        action = places[d.option.group].add_argument(
            *(d.option.flags or (d.option.label,)), dest=d.key, help=d.option.help,
            **_how(d.option))
        if d.option.completes == "hosts":
            action.completer = hosts
    p.add_argument("script", nargs="?", default=None, help=positional["script"])
    p.add_argument("script_args", nargs=argparse.REMAINDER, default=[],
                   help=positional["args"])
    p.set_defaults(func=_main, unknown_hint=unknown_hint, takes_separator=True,
                   tool_options=frozenset(o for a in p._actions for o in a.option_strings))


def _how(option: Option) -> dict[str, Any]:
    """An option's argparse arguments, from its kind: a flag, a number, a repeatable
    item, or a word."""
    kind = option.kind
    if isinstance(kind, Flag):
        return {"action": "store_true"}
    how: dict[str, Any] = {"metavar": option.metavar} if option.metavar else {}
    if isinstance(kind, ListOf | MapOf):
        how["action"] = "append"
    elif isinstance(kind, Whole):
        how["type"] = int
    elif isinstance(kind, Number):
        how["type"] = float
    if option.choices:
        how["choices"] = option.choices
    return how


def parse_request(args: argparse.Namespace) -> Any:
    """The run's spec (a SPEC) from the parsed command line (and its job file)."""
    return from_sources(sources(args), SPEC)


def _main(args: argparse.Namespace) -> int:
    return train(parse_request(args), dry_run=args.dry_run)
