"""The share's cordon record (orchestrator/node/cordon.py), on a real directory: a node's
newest event decides, events by two users never overwrite each other, and a share without
the record's directory is named with its fix. The record on the sandbox's share, read by
preflight: tests/e2e/test_cluster.py::test_killed_node_then_provision_again_and_resume."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest

from orchestrator.node import cordon


@pytest.fixture
def share(tmp_path: Path) -> str:
    (tmp_path / cordon.CORDONS_SUBDIR).mkdir(mode=0o1777)
    return str(tmp_path)


def test_the_newest_event_decides(share: str) -> None:
    assert cordon.current(share, "node1") is None
    cordon.record(share, "node1", cordon.CORDON, "lost mid-run r1", run="r1", now=100.0)
    got = cordon.current(share, "node1")
    assert got is not None and got["why"] == "lost mid-run r1" and got["run"] == "r1"
    assert got["by"] == getpass.getuser() and got["since"] == "1970-01-01T00:01:40+00:00"
    cordon.record(share, "node1", cordon.UNCORDON, "fixed", now=200.0)
    assert cordon.current(share, "node1") is None
    cordon.record(share, "node1", cordon.CORDON, "lost again", now=300.0)
    assert (cordon.current(share, "node1") or {}).get("why") == "lost again"
    # Nothing was overwritten: three events, three files.
    assert len(list(Path(share, cordon.CORDONS_SUBDIR).iterdir())) == 3


def test_one_nodes_events_are_not_anothers(share: str) -> None:
    cordon.record(share, "node10", cordon.CORDON, "a bad fan", now=100.0)
    cordon.record(share, "node1", cordon.CORDON, "lost", now=50.0)
    cordon.record(share, "node1", cordon.UNCORDON, "fixed", now=150.0)
    assert cordon.current(share, "node1") is None
    assert (cordon.current(share, "node10") or {}).get("why") == "a bad fan"
    assert list(cordon.cordoned(share)) == ["node10"]


def test_a_file_that_does_not_read_is_left_out(share: str) -> None:
    cordon.record(share, "node1", cordon.CORDON, "lost", now=100.0)
    where = Path(share, cordon.CORDONS_SUBDIR)
    (where / "node1@200000000000@mallory.json").write_text("{cut short")
    (where / "node1@300000000000@mallory.json").write_text(json.dumps(["not", "an", "event"]))
    assert (cordon.current(share, "node1") or {}).get("why") == "lost"


def test_a_share_without_the_record_says_how_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(cordon.NoRecord, match="run site.yml"):
        cordon.record(str(tmp_path), "node1", cordon.CORDON, "lost")
    assert cordon.current(str(tmp_path), "node1") is None
    said = cordon.main({"share": str(tmp_path), "node": "node1", "action": "cordon",
                        "why": "x"})
    assert "cordons does not exist" in said["error"]
