"""A run's record that cannot be read (issue 66, item 3): a run.json, summary.json or
doctor.json cut short, not JSON, not UTF-8, a list instead of an object, or an object
whose values are of another kind. Every verb that reads it names the file, what is wrong
with it and what to do, never a traceback; `runs` lists the run as unreadable and goes
on. Real records (the report tests' recorded runs) in a real runs directory, corrupted on
disk, through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.record.rundir import RunDir

from ...clirun import run_cli as run
from ..report.recorded import write_run

NODES = ["node0", "node1"]
RUN = "20260921-101500-a1b2c3"
GOOD = "20260921-091500-0a0b0c"


def edited(name: str, **values: object) -> tuple[str, object]:
    """A file of the record with VALUES set in its JSON object (None: the key removed)."""
    return name, values


# (file, its new text, bytes, or {key: value} edits of its JSON)
BROKEN = {
    "run.json cut short": ("run.json", '{"run_id": "2026'),
    "run.json a list": ("run.json", "[]"),
    "run.json not UTF-8": ("run.json", b"\xff\xfe{}"),
    "run.json without nodes": edited("run.json", nodes=None),
    "run.json nodes not a list": edited("run.json", nodes="node0"),
    "run.json nodes not names": edited("run.json", nodes=[1, 2]),
    "run.json users a list": edited("run.json", users=["alice"]),
    "run.json inventory a number": edited("run.json", inventory=3),
    "summary.json cut short": ("summary.json", '{"status": "succ'),
    "summary.json a list": ("summary.json", "[1, 2]"),
    "summary.json duration not a number": edited("summary.json", duration_s="long"),
    "summary.json nodes not mappings": edited("summary.json", nodes=[1]),
    "summary.json first_failed a list": edited("summary.json", first_failed=["node1"]),
}

# Each verb that takes a run, and whether it reads the run's summary (`logs` follows the
# logs alone; `diagnose` and `notebook connect` refuse these records (made without node
# commands, not a notebook) first).
VERBS = {("runs", "show"): True, ("runs", "report"): True, ("attach",): True,
         ("logs",): False, ("stop",): True, ("diagnose",): False,
         ("notebook", "connect"): False, ("notebook", "stop"): True}


def corrupt(run: RunDir, file: str, change: object) -> Path:
    path = run.path / file
    if isinstance(change, dict):
        data = json.loads(path.read_text())
        for key, value in change.items():
            data.pop(key) if value is None else data.__setitem__(key, value)
        path.write_text(json.dumps(data))
    elif isinstance(change, bytes):
        path.write_bytes(change)
    else:
        path.write_text(str(change))
    return path


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    write_run(root, GOOD, NODES, 30)
    return root


def named(code: int, out: str, path: Path) -> None:
    """Refused (exit 2), naming PATH and what to do; no traceback."""
    assert "Traceback" not in out, out
    assert code == 2 and str(path) in out and "fix" in out, out


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_corrupt_record_is_named_by_every_verb_that_reads_it(runs: Path, capsys,
                                                               case: str) -> None:
    file, change = BROKEN[case]
    path = corrupt(write_run(runs, RUN, NODES, 30), file, change)
    for verb, reads_summary in VERBS.items():
        code, out = run([*verb, RUN, "--runs-dir", str(runs)], capsys)
        if file == "run.json" or reads_summary:
            named(code, out, path)
        assert "Traceback" not in out, out
    code, out = run(["runs", "show", RUN, "--runs-dir", str(runs)], capsys)
    assert f"error: run {RUN}: {path}" in out, out


@pytest.mark.parametrize("case", list(BROKEN))
def test_runs_lists_a_corrupt_record_as_unreadable_and_goes_on(runs: Path, capsys,
                                                               case: str) -> None:
    file, change = BROKEN[case]
    path = corrupt(write_run(runs, RUN, NODES, 30), file, change)
    code, out = run(["runs", "--runs-dir", str(runs)], capsys)
    rows = {line.split()[0]: line for line in out.splitlines() if line[:1].isdigit()}
    assert code == 0 and "Traceback" not in out, out
    assert "succeeded" in rows[GOOD] and "unreadable" in rows[RUN], out
    assert f"note: run {RUN}: {path}" in out, out


def test_a_corrupt_doctor_verdict_is_named_not_a_failed_listing(runs: Path, capsys) -> None:
    run_ = write_run(runs, RUN, NODES, 30, doctor="throttled-node1-2nodes.json")
    corrupt(run_, "run.json", {"script": "orchestrator.node.doctor"})   # a doctor's run
    (run_.path / "doctor.json").write_text('{"suspects": [')
    code, out = run(["runs", "--runs-dir", str(runs)], capsys)
    assert code == 0 and "Traceback" not in out, out
    assert f"{run_.path / 'doctor.json'} cannot be read" in out, out
    code, out = run(["runs", "show", RUN, "--runs-dir", str(runs)], capsys)
    named(code, out, run_.path / "doctor.json")


def test_a_running_run_without_its_inventory_is_named(runs: Path, capsys) -> None:
    """A run with no summary yet is settled from its nodes: its inventory is needed."""
    run_ = write_run(runs, RUN, NODES, 30)
    run_.summary_json.unlink()
    corrupt(run_, "run.json", {"inventory": None})
    for verb in (["runs", "show"], ["runs", "report"], ["stop"], ["notebook", "stop"]):
        code, out = run([*verb, RUN, "--runs-dir", str(runs)], capsys)
        assert code == 2 and f"{run_.run_json} lacks inventory" in out, out
        assert "Traceback" not in out
