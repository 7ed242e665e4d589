"""A user's YAML file read strictly (config/yamlfile.py): a tag written in the file is
never trusted (`nodes: !!int "two"` is no traceback, `queue: !!bool "yes"` is not false),
and an alias is refused, so a small file cannot grow into a huge value ("billion
laughs"); each refusal names the file, the line, the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.yamlfile import compose
from orchestrator.errors import InputError


def refusal(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as got:
        compose(path, "a job file")
    return str(got.value)


@pytest.mark.parametrize("text, words", [
    ('nodes: !!int "two"\n', 'job.yaml line 1: nodes: the tag !!int is not read here; '
                             'leave it out and write the value plainly (nodes: "two")'),
    ('queue: !!bool "yes"\n', "line 1: queue: the tag !!bool is not read here"),
    ("grace: !!float 1\n", "line 1: grace: the tag !!float is not read here; leave it out "
                           "and write the value plainly (grace: 1)"),
    ("workdir: !!null x\n", "line 1: workdir: the tag !!null is not read here"),
    ("workdir: !!str code\n", "line 1: workdir: the tag !!str is not read here"),
    ("partition: !!binary aGk=\n", "line 1: partition: the tag !!binary is not read here"),
    ("time: !!timestamp 2024-01-01\n", "line 1: time: the tag !!timestamp is not read here"),
    ("hosts: !!set {a, b}\n", "line 1: hosts: the tag !!set is not read here; leave it out"),
    ("env: !!omap [A: '1']\n", "line 1: env: the tag !!omap is not read here"),
    ("nodes: 2\nargs: [--lr, !foo 3]\n", "line 2: args[1]: the tag !foo is not read here"),
    ("env:\n  LR: ! 0.1\n", "line 2: env.LR: the tag ! is not read here"),
    ("!!str nodes: 2\n", "line 1: a key: the tag !!str is not read here"),
    ("--- !!map\nnodes: 2\n", "line 1: the file: the tag !!map is not read here"),
])
def test_a_tag_in_the_file_is_refused_naming_the_key_and_the_fix(tmp_path, text,
                                                                 words) -> None:
    assert words in refusal(tmp_path, text)


def test_an_alias_is_refused_so_a_small_file_cannot_grow_huge(tmp_path) -> None:
    laughs = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 30)]
    words = refusal(tmp_path, "\n".join(laughs) + "\n")
    assert "job.yaml line 2: a1[0]: *a0 repeats the value anchored on line 1; this file " \
           "takes no aliases: write the value out" in words
    assert "line 2: args[0]: *x repeats the value anchored on line 1" in refusal(
        tmp_path, "env: &x {A: '1'}\nargs: [*x]\n")


def test_a_plain_or_quoted_value_is_read_as_before(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("nodes: 2\nqueue: true\npartition: 'gpu'\nenv: &e {A: '1'}\n")
    root = compose(path, "a job file")
    assert root is not None and [k.value for k, _ in root.value] == [
        "nodes", "queue", "partition", "env"]   # an anchor alone harms nothing
