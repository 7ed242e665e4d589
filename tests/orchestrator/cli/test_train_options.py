"""Each of train's options is declared once (issue 52, item 3): a field of the spec with
its Option (run/spec.py). A spec with one more such field is all it takes for train to
have one more option: in its parser and --help, in the spec it reads, in its job file
(read and written, its kind checked), in the dry run's job file and in the shell's
completion. No sandbox: nothing here reaches a node."""

from __future__ import annotations

import argparse
import io
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import argcomplete
import pytest

from orchestrator.cli import build_parser, cmd_train, parse
from orchestrator.config.kinds import Text
from orchestrator.config.options import Option, option
from orchestrator.errors import InputError
from orchestrator.run.lifecycle import Plan
from orchestrator.run.spec import KEYS, RunSpec, from_sources, read_job_file

from ...clirun import run_cli as run


def _colour(value: Any, label: str) -> str:
    if value not in ("red", "green", "blue"):
        raise InputError(f"{label} {value!r}: give red, green or blue")
    return str(value)


@dataclass(frozen=True)
class Wider(RunSpec):
    """RunSpec and one entry more."""

    colour: str | None = option(None, Option(
        Text("a colour's name"), "the run's colour in the report (red, green or blue)",
        metavar="NAME", check=_colour))


@pytest.fixture
def wider(monkeypatch, tmp_path: Path) -> Path:
    """train reading Wider; a work directory with job.py."""
    monkeypatch.setattr(cmd_train, "SPEC", Wider)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "job.py").write_text("print('hi')\n")
    return tmp_path


class Finder(argcomplete.CompletionFinder):
    """argcomplete's own, its debug output on stderr (its default, fd 9, is pytest's)."""

    def _init_debug_stream(self) -> None:
        argcomplete.io.debug_stream = sys.stderr


def complete(line: str, monkeypatch) -> list[str]:
    """What the shell would be offered for LINE (argcomplete, as the shell asks it)."""
    for name, value in (("_ARGCOMPLETE", "1"), ("COMP_LINE", line),
                        ("COMP_POINT", str(len(line))), ("_ARGCOMPLETE_IFS", "\013")):
        monkeypatch.setenv(name, value)
    out = io.StringIO()
    with pytest.raises(SystemExit):
        Finder()(build_parser(), exit_method=sys.exit, output_stream=out)
    return [w.strip() for w in out.getvalue().split("\013") if w.strip()]


def test_one_entry_is_an_option_in_the_parser_the_spec_the_job_file_the_dry_run_and_the_completion(  # noqa: E501
        wider: Path, monkeypatch, capsys) -> None:
    work = str(wider / "code")
    # the parser, and its help
    code, out = run(["train", "--help"], capsys)
    assert code == 0 and "--colour NAME" in out and "the run's colour in the report" in out
    # the spec
    spec = cmd_train.parse_request(parse(["train", "--colour", "red", "--workdir", work,
                                          "-i", str(wider / "hosts.ini"), "--runs-dir",
                                          str(wider / "runs"), "job.py"]))
    assert isinstance(spec, Wider) and spec.colour == "red"
    assert cmd_train.parse_request(parse(["train", "--workdir", work, "job.py"])).colour is None
    # its check, at the door: exit 2, the message its entry gives
    code, out = run(["train", "--colour", "ultraviolet", "--workdir", work, "job.py"], capsys)
    assert code == 2 and "error: --colour 'ultraviolet': give red, green or blue" in out, out
    # the job file: written, read back to the same spec, its kind checked with its line
    assert "colour: red\n" in spec.to_yaml()
    path = wider / "job.yaml"
    path.write_text(spec.to_yaml())
    assert from_sources(read_job_file(path, Wider), Wider) == spec
    path.write_text(f"workdir: {work}\ncolour: 3\n")
    code, out = run(["train", "-f", str(path)], capsys)
    assert code == 2 and f"{path} line 2: colour must be a colour's name, not 3" in out, out
    path.write_text(f"workdir: {work}\nscript: job.py\ncolour: green\n")
    assert cmd_train.parse_request(parse(["train", "-f", str(path)])).colour == "green"
    # the dry run's job file
    assert "colour: red" in Plan(replace(spec, workdir=None), "r1", [], {}).describe()
    # the shell's completion
    assert complete("clustertrain train --col", monkeypatch) == ["--colour"]


def test_without_the_entry_there_is_no_such_option(capsys, monkeypatch) -> None:
    """The test above sees the entry, not an option that was there anyway."""
    code, out = run(["train", "--colour", "red"], capsys)
    assert code == 2 and "unrecognized arguments: --colour" in out
    assert "colour" not in KEYS
    assert complete("clustertrain train --col", monkeypatch) == []


def test_every_option_of_the_spec_is_in_the_parser_and_the_job_file() -> None:
    """The table and what comes of it agree, option by option."""
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    train = verbs.choices["train"]
    dests = {a.dest for a in train._actions}
    spec = RunSpec()
    for key in KEYS:
        assert key in spec.to_file() or key == "module", key   # module: written as script's
        assert key in dests or key in ("args", "script"), key
