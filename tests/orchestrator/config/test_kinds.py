"""A Record's keys (config/kinds.py): a key given no value is refused, never "not given";
a null is read as not given only for the keys whose own value may be none (NULLS)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.kinds import Record, Text, Whole, read_file
from orchestrator.errors import InputError

RECORD = Record({"name": Text("a name"), "count": Whole()}, nulls=frozenset({"count"}))


def read(tmp_path: Path, text: str) -> dict[str, object]:
    path = tmp_path / "f.yaml"
    path.write_text(text)
    return {k: v.value for k, v in read_file(path, RECORD, "a test file").items()}


@pytest.mark.parametrize("text, words", [
    ("name:\n", "f.yaml line 1: name is empty; give a name, or remove the line to use the "
                "default"),
    ("name: x\ncount:\n", "f.yaml line 2: count is empty; give a whole number"),
    ("name: ~\n", "f.yaml line 1: name is null; give a name"),
    ("name: null\n", "f.yaml line 1: name is null; give a name"),
])
def test_a_key_given_no_value_is_refused(tmp_path, text, words) -> None:
    with pytest.raises(InputError) as got:
        read(tmp_path, text)
    assert words in str(got.value)


def test_a_null_of_a_key_that_may_be_none_is_not_given(tmp_path) -> None:
    assert read(tmp_path, "name: x\ncount: null\n") == {"name": "x"}
    assert read(tmp_path, "name: x\ncount: ~\n") == {"name": "x"}
