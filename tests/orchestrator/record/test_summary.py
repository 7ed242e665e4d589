"""summary.json, typed (orchestrator/record/summary.py): a record of each version this one
reads (records/: summary-v1-*.json written by the version before, real runs on the
sandbox, a recovered attempt and a detached run settled from its nodes' states;
summary-v2-recovered.json the same run as this version writes it) reads through RunDir
as `runs` and the report read it; a record of a later version, or one whose status is not a
status, is refused naming the file and the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.record.rundir import RecordUnreadable, RunDir
from orchestrator.record.summary import VERSION, Recovery, RunStatus, Summary

RECORDS = Path(__file__).parent / "records"


def stored(tmp_path: Path, name: str) -> tuple[RunDir, dict]:
    """The stored record NAME as a run of TMP_PATH: its run.json (the summary's run keys)
    and its summary.json as it was written."""
    data = json.loads((RECORDS / name).read_text())
    run = RunDir(tmp_path, data["run_id"])
    run.create({**data, "nodes": [n["name"] for n in data["nodes"]]})
    shutil.copy(RECORDS / name, run.summary_json)
    return run, data


@pytest.mark.parametrize("name", ["summary-v1-recovered.json", "summary-v2-recovered.json"])
def test_a_recovered_attempt_of_each_version_reads_whole(tmp_path: Path, name: str,
                                                         capsys) -> None:
    run, data = stored(tmp_path, name)
    summary = run.summary()
    assert summary is not None and summary.version == data.get("version", 1)
    assert (summary.status, summary.first_failed) == (RunStatus.FAILED, "node2")
    assert summary.run_id == data["run_id"] and summary.recovery_of == data["recovery_of"]
    assert [(n.name, n.node_rank, n.exit_code, n.end_reason) for n in summary.nodes] == [
        ("node0", 0, 143, "stopped"), ("node2", 1, 1, "exited")]
    [recovery] = summary.recoveries
    assert isinstance(recovery, Recovery) and (recovery.node, recovery.spare,
                                               recovery.restart_s) == ("node1", "node2", 3.198)
    assert summary.info["slurm"] == data["slurm"]   # run.json's keys are kept as they were
    assert main(["runs", "show", run.run_id, "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"run {run.run_id}: failed (first failed: node2)" in out
    assert f"recovery 1: node1 rank 1 killed (SIGKILL) at {recovery.failed_at}" in out


def test_a_detached_run_settled_by_the_version_before_reads_whole(tmp_path: Path) -> None:
    run, data = stored(tmp_path, "summary-v1-settled.json")
    summary = run.summary()
    assert summary is not None and summary.version == 1 and "version" not in data
    assert summary.settled_from == data["settled_from"] and summary.status == RunStatus.FAILED
    assert summary.node(summary.first_failed) is not None
    assert summary.exit_codes == data["exit_codes"]


@pytest.mark.parametrize("name", ["summary-v1-recovered.json", "summary-v1-settled.json"])
def test_this_version_writes_the_version_befores_record_unchanged_but_its_number(
        tmp_path: Path, name: str) -> None:
    """Read and written again (a recovery completed, a node kept out), a record of the
    version before keeps every key and value it had: version 2 adds its number alone."""
    run, data = stored(tmp_path, name)
    summary = run.summary()
    assert summary is not None
    run.write_summary(summary)
    again = json.loads(run.summary_json.read_text())
    assert again.pop("version") == VERSION == 2
    assert again == data
    assert run.summary() == Summary.from_json({**data, "version": 2})


def test_a_record_of_a_later_version_is_refused_with_the_fix(tmp_path: Path, capsys) -> None:
    run, data = stored(tmp_path, "summary-v2-recovered.json")
    run.summary_json.write_text(json.dumps({**data, "version": 3}))
    with pytest.raises(RecordUnreadable, match=r"its version is 3: this clustertrain reads "
                       r"versions 1 and 2 \(a newer one wrote it\)"):
        run.summary()
    assert main(["runs", "--runs-dir", str(tmp_path)]) == 0   # the other runs still list
    assert "unreadable" in capsys.readouterr().out


@pytest.mark.parametrize("edit, said", [
    ({"status": "fine"}, "status is \"fine\", not one of running, succeeded"),
    ({"version": "2"}, "version is \"2\", not a whole number"),
    ({"recoveries": [{"attempt": 1}]}, "a recovery is not whole"),
])
def test_a_record_edited_out_of_shape_is_named(tmp_path: Path, edit: dict, said: str) -> None:
    run, data = stored(tmp_path, "summary-v2-recovered.json")
    run.summary_json.write_text(json.dumps({**data, **edit}))
    with pytest.raises(RecordUnreadable, match="summary.json") as refused:
        run.summary()
    assert said in str(refused.value) and str(run.path) in str(refused.value)
