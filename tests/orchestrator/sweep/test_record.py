"""A sweep's record (orchestrator/sweep/record.py): sweep.json that cannot be read is one
typed error (SweepUnreadable, a RecordUnreadable) naming the file, what is wrong with it
and the fix, for every reader (the verbs, the web view)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.record.rundir import RecordUnreadable
from orchestrator.sweep.record import SWEEP_JSON, SweepUnreadable, new_sweep, open_sweep
from orchestrator.sweep.sweepfile import Parameter, SweepSpec

SWEEP = SweepSpec("grid", (Parameter("--lr", ("0.1", "0.01")),), "loss")


def edited(data: dict, **changes) -> str:
    return json.dumps({**data, **changes})


@pytest.mark.parametrize(("edit", "says"), [
    (lambda d: "{\"sweep_id\": ", "is not JSON"),
    (lambda d: b"{\xff\xfe}", "is not JSON"),
    (lambda d: "[]", "is not a JSON object"),
    (lambda d: edited({k: v for k, v in d.items() if k not in ("metric", "trials")}),
     "lacks metric, trials"),
    (lambda d: edited(d, trials={"1": {}}), "trials is not a list"),
    (lambda d: edited(d, trials=[{"number": 1}]), "trial 1 lacks values"),
    (lambda d: edited(d, trials=[{**d["trials"][0], "state": "bogus"}]),
     "trial 1: state 'bogus' is not one of pending, running"),
    (lambda d: edited(d, trials=["t1"]), "trial 1 is not a JSON object"),
    (lambda d: edited(d, trials=[{**d["trials"][0], "values": 5}]), "trial 1: "),
    (lambda d: edited(d, early_stop={"after": 3, "when": 1}), "early_stop"),
    (lambda d: edited(d, colour="red"), "unknown key 'colour'"),
], ids=["cut-short", "not-utf8", "a-list", "missing-keys", "trials-not-list",
        "trial-missing", "trial-state", "trial-not-object", "trial-values", "early-stop",
        "unknown-key"])
def test_a_sweep_json_that_cannot_be_read_is_one_typed_error(tmp_path: Path, edit,
                                                             says: str) -> None:
    record = new_sweep(tmp_path, tmp_path / "s.yaml", SWEEP, SWEEP.expand(), 1)
    path = record.path / SWEEP_JSON
    text = edit(json.loads(path.read_text()))
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SweepUnreadable) as refused:
        open_sweep(tmp_path, record.sweep_id)
    said = str(refused.value)
    assert isinstance(refused.value, RecordUnreadable)   # as a run's record is
    assert said.startswith(f"sweep {record.sweep_id}: {path} "), said
    assert says in said, said
    assert said.endswith(f"restore the file, or remove the sweep's directory {record.path}/ "
                         "if you no longer need the sweep (its trials' runs stay)"), said


def test_a_sweep_written_reads_back_whole(tmp_path: Path) -> None:
    record = new_sweep(tmp_path, tmp_path / "s.yaml", SWEEP, SWEEP.expand(), 2)
    again = open_sweep(tmp_path, record.sweep_id)
    assert again == record
