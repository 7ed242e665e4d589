"""The command line's parser (cli/__init__.py): a command that names its verb loads only
that verb's module, and the verb's parser is the same as in the whole one (options, help,
errors); help, an unknown verb and the shell's completion still see every verb."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import VERBS, build_parser, parse

REPO = Path(__file__).resolve().parents[3]


def verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_verb_registered_is_named_in_verbs_and_only_those() -> None:
    """VERBS names every verb (and alias) the modules register: a verb left out of it
    would be loaded only through the whole parser."""
    assert set(verbs(build_parser())) == set(VERBS)


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_verbs_own_parser_is_the_whole_parsers(verb: str) -> None:
    """The parser built for one verb: the same help (every option, its usage line) and the
    same arguments as that verb's part of the whole parser."""
    whole, alone = verbs(build_parser())[verb], verbs(build_parser(verb))[verb]
    assert alone.format_help() == whole.format_help()
    assert [(a.option_strings, a.dest, a.default) for a in alone._actions] == \
        [(a.option_strings, a.dest, a.default) for a in whole._actions]


def test_a_verb_loads_only_its_own_module() -> None:
    """`train ...` imports cmd_train and no other verb's module (each costs a command
    its imports); the arguments parse as before."""
    code = ("import sys; from orchestrator.cli import COMMANDS, parse; "
            "a = parse(['train', '--nodes', '2', 'job.py', '--', '--lr', '1']); "
            "print(a.command, a.script, a.after_separator); "
            "print(sorted(m for m in COMMANDS if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    said, loaded = out.stdout.splitlines()
    assert said == "train job.py ['--lr', '1']"
    assert loaded == "['orchestrator.cli.cmd_train']"


def test_an_unknown_verb_and_top_level_help_list_every_verb(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["trian"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'trian'" in err and all(v in err for v in ("train", "doctor"))
    with pytest.raises(SystemExit):
        parse(["--help"])
    listed = capsys.readouterr().out
    assert all(v in listed for v in ("train", "sandbox", "completion", "runs"))


def test_a_verbs_error_is_said_with_its_own_usage(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["stop", "--nope"])
    assert exc.value.code == 2
    assert "usage: python -m orchestrator stop" in capsys.readouterr().err


def test_the_shell_asking_for_completions_gets_every_verb(tmp_path: Path) -> None:
    """argcomplete's request (its variables set) is answered from the whole parser."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "_ARGCOMPLETE": "1",
           "_ARGCOMPLETE_STDOUT_FILENAME": str(out), "_ARGCOMPLETE_IFS": "\n",
           "COMP_LINE": "clustertrain ", "COMP_POINT": "13", "COMP_TYPE": "9"}
    subprocess.run([sys.executable, "-m", "orchestrator"], cwd=REPO, env=env,
                   capture_output=True, timeout=60)
    offered = set(out.read_text().split())
    assert offered >= set(VERBS)
