"""`usage`: node- and GPU-hours from the runs' records on the share, over a recorded set of
runs of two users, checked against figures computed by hand; a record counts for its
file's owner, one in another user's name is refused and said, and a planted pipe or link
neither hangs nor fools it. The records are those of real users of this machine, alice and
bob, made here (as root) for these tests: a record counts only for its owner."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.cli.cmd_usage import since_of, table
from orchestrator.errors import InputError
from orchestrator.node import ledger, usage
from orchestrator.node.answers import UsageAnswer

from .conftest import give

NOW = 1_800_000_000.0
H = 3600.0
D = 86400.0
SINCE = NOW - 24 * H


def record(share: Path, user: str, run: str, node: str, owner: str | None = None,
           **state) -> Path:
    """A node's state in USER's records, written by OWNER (by default USER)."""
    path = share / "checkpoints" / user / ".clustertrain" / "runs" / run / f"{node}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"node": node, "user": user, **state}))
    give(path, owner or user, share / "checkpoints")
    return path


@pytest.fixture
def share(tmp_path: Path, people: None) -> Path:
    # alice: 2 nodes x 2 h with 4 GPUs each, ended: 4 node-hours, 16 GPU-hours; node0's
    # GPUs did nothing for 1.5 h of it: 6 idle GPU-hours.
    for node, idle in (("node0", 1.5 * 4 * H), ("node1", 0.0)):
        record(tmp_path, "alice", "a1", node, started=NOW - 5 * H, ended=NOW - 3 * H,
               state="ended", gpus=4, gpu_idle_s=idle)
    # alice: running on one CPU node for 29 minutes so far (its state last written 1 min
    # ago): 0.4833 node-hours, no GPU.
    record(tmp_path, "alice", "a2", "node2", started=NOW - 30 * 60, time=NOW - 60,
           state="running", gpus=0)
    # bob: 3 nodes with 2 GPUs each from 1 h before the window to 1 h into it: only the
    # hour inside counts, 3 node-hours, 6 GPU-hours; each node idle 1 GPU-hour over its 2 h,
    # half of it inside: 1.5 idle GPU-hours. A recovery plan beside them is no node's state.
    for node in ("node0", "node1", "node2"):
        record(tmp_path, "bob", "b1", node, started=SINCE - H, ended=SINCE + H, gpus=2,
               gpu_idle_s=H)
    plan = tmp_path / "checkpoints/bob/.clustertrain/runs/b1/plan.json"
    plan.write_text('{"nodes": []}')
    give(plan, "bob", tmp_path / "checkpoints")
    # bob: a run over before the window: not counted.
    record(tmp_path, "bob", "b0", "node0", started=SINCE - 5 * H, ended=SINCE - 4 * H, gpus=8)
    # carol has a directory and no run yet.
    (tmp_path / "checkpoints" / "carol").mkdir()
    return tmp_path


def test_hours_per_user_and_run_are_the_hand_computed_figures(share: Path) -> None:
    found = usage.usage(str(share), SINCE, NOW)
    assert found["users"] == {
        "alice": {"runs": 2, "node_hours": round(4 + 29 / 60, 3), "gpu_hours": 16.0,
                  "idle_gpu_hours": 6.0},
        "bob": {"runs": 1, "node_hours": 3.0, "gpu_hours": 6.0, "idle_gpu_hours": 1.5}}
    runs = {r["run"]: r for r in found["runs"]}
    assert set(runs) == {"a1", "a2", "b1"}
    assert runs["a1"]["nodes"] == ["node0", "node1"] and runs["a1"]["end"] == NOW - 3 * H
    assert runs["a2"]["end"] is None and runs["a2"]["node_hours"] == round(29 / 60, 4)
    assert runs["b1"]["start"] == SINCE - H and runs["b1"]["gpu_hours"] == 6.0
    assert [r["run"] for r in found["idle"]] == ["a1", "b1"]   # an idle GPU-hour or more
    assert runs["a2"]["idle_gpu_hours"] == 0.0
    assert found["unread"] == []


def test_the_table_puts_the_most_gpu_hours_first_and_lists_runs(share: Path) -> None:
    lines = table(UsageAnswer.from_json(usage.usage(str(share), SINCE, NOW)), runs=True)
    assert lines[1].split() == ["USER", "RUNS", "NODE-HOURS", "GPU-HOURS", "IDLE"]
    assert lines[2].split() == ["alice", "2", "4.48", "16.00", "6.00"]
    assert lines[3].split() == ["bob", "1", "3.00", "6.00", "1.50"]
    rows = [line.split() for line in lines[5:8]]
    assert [r[0] for r in rows] == ["b1", "a1", "a2"]   # by start
    assert rows[2][-1] == "running"
    assert lines[8:] == [
        "idle: a1 (alice, node0, node1) held 6.00 of its 16.00 GPU-hours with its GPUs "
        "doing nothing (at or under 1 % used)",
        "idle: b1 (bob, node0, node1, node2) held 1.50 of its 6.00 GPU-hours with its GPUs "
        "doing nothing (at or under 1 % used)"]


def test_a_node_whose_supervisor_went_silent_ended_at_its_last_word(tmp_path: Path,
                                                                    people: None) -> None:
    """A node lost mid-run never writes its end: its state says running for good. Once
    its last writing is older than STATE_STALE it ended then (as `runs` settles it), and
    the run is not listed as running for ever."""
    from orchestrator.node.protocol import STATE_STALE

    record(tmp_path, "alice", "a3", "node0", started=NOW - 2 * H, ended=NOW - H, gpus=1)
    record(tmp_path, "alice", "a3", "node1", started=NOW - 2 * H, time=NOW - 1.5 * H,
           state="running", gpus=1)
    record(tmp_path, "alice", "a4", "node0", started=NOW - H, time=NOW - STATE_STALE / 2,
           state="running", gpus=1)
    runs = {r["run"]: r for r in usage.usage(str(tmp_path), SINCE, NOW)["runs"]}
    assert runs["a3"]["end"] == NOW - H and runs["a3"]["node_hours"] == 1.5
    assert runs["a4"]["end"] is None   # its supervisor wrote a minute ago: still running


def test_a_users_ledger_counts_its_days_in_the_window_and_its_pending_runs_once(
        share: Path) -> None:
    """bob's runs folded away (node/fold.py) count from his ledger: its days whose middle
    lies in the window, whole; a run it names pending (counted, its directory not removed
    yet) is not counted again from its records. The table says which days it gave."""
    day = ledger.day_of(SINCE + 4 * H)   # its middle inside the window, the day before's not
    before = ledger.day_of(SINCE - D)
    book = ledger.Ledger({before: ledger.Day(5, 10 * H, 80 * H, 0.0),
                          day: ledger.Day(2, 4 * H, 8 * H, 2 * H)}, pending=["b1"])
    path = share / "checkpoints/bob/.clustertrain" / ledger.LEDGER
    path.write_text(json.dumps(book.to_json()))
    give(path, "bob", share / "checkpoints")
    found = usage.usage(str(share), SINCE, NOW)
    assert found["users"]["bob"] == {"runs": 2, "node_hours": 4.0, "gpu_hours": 8.0,
                                     "idle_gpu_hours": 2.0}
    assert found["ledger"] == {"bob": {"runs": 2, "node_hours": 4.0, "gpu_hours": 8.0,
                                       "idle_gpu_hours": 2.0, "first_day": day,
                                       "last_day": day}}
    assert "b1" not in {r["run"] for r in found["runs"]}
    assert found["users"]["alice"]["gpu_hours"] == 16.0   # hers as before: no ledger
    lines = table(UsageAnswer.from_json(found))
    assert f"folded: bob's runs of {day} to {day} (UTC days; 2 started then) are counted " \
        "by the day from the usage ledger: their records were folded 30 days after they " \
        "ended" in lines, lines
    earlier = usage.usage(str(share), SINCE - D, NOW)["ledger"]["bob"]
    assert (earlier["first_day"], earlier["runs"], earlier["gpu_hours"]) == (before, 7, 88.0)


def test_the_gpus_a_nodes_part_uses() -> None:
    assert usage.gpus_used([], {"CUDA_VISIBLE_DEVICES": "0,1"}) == 2   # Slurm's choice
    assert usage.gpus_used([], {"CUDA_VISIBLE_DEVICES": ""}) == 0
    argv = ["torchrun", "--nnodes", "2", "--nproc-per-node", "4", "x.py"]
    assert usage.gpus_used(argv, {}, devices=8) == 4
    assert usage.gpus_used(["torchrun", "--nproc_per_node=gpu"], {}, devices=8) == 8
    assert usage.gpus_used(argv, {}, devices=0) == 0


def test_a_date_that_is_not_one_is_refused_naming_the_forms() -> None:
    assert since_of("2026-11-01", NOW) < NOW
    assert since_of(None, NOW) == NOW - 30 * 86400
    with pytest.raises(InputError, match=r"usage --since '1 week': not a date; give "
                                         r"YYYY-MM-DD"):
        since_of("1 week", NOW)


def test_a_record_counts_for_its_files_owner_not_the_directory_it_lies_in(
        share: Path) -> None:
    """bob bills thousands of GPU-hours to carol (no such user here) and to a look-alike of
    alice (a Cyrillic а), and moves a run of his own out of his directory: none counts, and
    each is said, naming its file and its owner."""
    forged = {"started": NOW - 10 * H, "ended": NOW - H, "gpus": 512}
    paths = [record(share, "carol", "c1", "node0", owner="bob", **forged),
             record(share, "\u0430lice", "x1", "node0", owner="bob", **forged),
             record(share, "alice", "x2", "node0", owner="bob", **forged)]
    found = usage.usage(str(share), SINCE, NOW)
    assert set(found["users"]) == {"alice", "bob"}
    assert found["users"]["alice"]["gpu_hours"] == 16.0
    assert found["users"]["bob"]["gpu_hours"] == 6.0
    assert {r["run"] for r in found["runs"]} == {"a1", "a2", "b1"}
    refused = {r["path"]: r for r in found["refused"]}
    shown = [str(p).replace("\u0430", "\\u0430") for p in paths]
    assert sorted(refused) == sorted(shown), refused
    assert {r["owner"] for r in refused.values()} == {"bob"}
    assert refused[shown[2]]["why"] == "its owner is bob, not alice, whose directory it " \
        "lies in: not counted"


@pytest.mark.timeout(60)
def test_a_planted_pipe_or_link_in_a_run_neither_hangs_nor_reads_without_end(
        share: Path) -> None:
    runs = share / "checkpoints" / "bob" / ".clustertrain" / "runs" / "b1"
    os.mkfifo(runs / "node8.json")
    (runs / "node9.json").symlink_to("/dev/zero")
    for name in ("node8.json", "node9.json"):
        give(runs / name, "bob", share / "checkpoints")
    started = time.monotonic()
    found = usage.usage(str(share), SINCE, NOW)
    assert time.monotonic() - started < 5
    assert found["users"]["bob"]["gpu_hours"] == 6.0
    whys = {Path(r["path"]).name: r["why"] for r in found["refused"]}
    assert whys == {"node8.json": "not a regular file (a pipe, a device or a directory)",
                    "node9.json": "a symbolic link: not followed"}, whys
