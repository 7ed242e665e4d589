"""`runs` and `logs` read the local run records (no nodes needed)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.record.rundir import RunDir, latest_attempt, new_run_id
from orchestrator.record.summary import Summary
from orchestrator.run.conclude import write_summary


def make_run(root: Path, finished: bool) -> RunDir:
    run = RunDir(root, new_run_id())
    run.create({"run_id": run.run_id, "nodes": ["node0", "node1"], "script": "ddp.py",
                "script_args": ["--epochs", "1"], "inventory": "inv.yml"})
    run.log("node0").write_text("node0/rank0 | hello\n")
    run.log("node1").write_text("node1/rank1 | world\n")
    if finished:
        run.write_summary(Summary.from_json({"status": "succeeded", "duration_s": 12.5}))
    return run


def test_runs_lists_status(tmp_path: Path, capsys) -> None:
    done = make_run(tmp_path, finished=True)
    assert main(["runs", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert done.run_id in out and "succeeded" in out and "12.5s" in out
    assert "ddp.py --epochs 1" in out


def test_runs_show_gives_each_nodes_end_step_time_stragglers_and_hang(tmp_path: Path,
                                                                      capsys) -> None:
    run = make_run(tmp_path, finished=False)
    run.write_summary(Summary.from_json({
        "status": "hung", "duration_s": 61.0, "first_failed": None,
        "nodes": [{"name": "node0", "exit_code": -15, "end_reason": "stopped"},
                  {"name": "node1", "exit_code": None, "end_reason": "lost"}],
        "step_times": {"node0": {"step_s": 0.13, "wait_s": 0.02, "samples_per_s": 61.5},
                       "node1": {"step_s": 0.41}},
        "stragglers": [{"node": "node1", "rank": 1, "step_s": 0.41, "median_step_s": 0.13,
                        "slower_pct": 215}],
        "hang": {"detected_at": "2026-11-23T05:00:00Z", "verdict": "rank 1 is outside",
                 "suspects": [{"node": "node1", "rank": 1, "frame": "f (a.py:3)",
                               "why": "is in f (a.py:3), outside any collective"}],
                 "dumps": "/runs/x/hang"}}))
    assert main(["runs", "show", run.run_id, "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"run {run.run_id}: hung after 61.0 s"
    assert out[2].split() == ["NODE", "EXIT", "END", "STEP_S", "WAIT_S", "SAMPLES/S"]
    assert out[3].split() == ["node0", "-15", "stopped", "0.130", "0.020", "61.5"]
    assert out[4].split() == ["node1", "-", "lost", "0.410", "-", "-"]
    assert out[5] == ("  straggler: node1 is 215 % slower than the median step time (rank 1: "
                      "0.410 s per step, median 0.130 s)")
    assert "    suspect: rank 1 on node1 is in f (a.py:3), outside any collective" in out
    assert main(["runs", run.run_id, "--runs-dir", str(tmp_path)]) != 0
    assert f"say `runs show {run.run_id}`" in capsys.readouterr().err


def test_runs_and_runs_show_tell_each_recovery(tmp_path: Path, capsys) -> None:
    first = make_run(tmp_path, finished=False)
    first.write_summary(Summary.from_json({"status": "failed", "duration_s": 30.0,
                                           "first_failed": "node1",
                                           "recovered_in": f"{first.run_id}.r1"}))
    last = RunDir(tmp_path, f"{first.run_id}.r1")
    last.create({"run_id": last.run_id, "nodes": ["node0", "node2"], "script": "ddp.py",
                 "script_args": [], "inventory": "inv.yml"})
    last.write_summary(Summary.from_json({"status": "succeeded", "duration_s": 40.0,
                                          "recoveries": [{
        "attempt": 1, "failed_run": first.run_id, "node": "node1", "why": "lost (x)",
        "failed_at": "T", "run_id": last.run_id, "nodes": ["node0", "node2"],
        "spare": "node2", "cordoned": True, "down_s": 13.3, "restart_s": 5.1,
        "resume_s": 6.8, "load_s": 0.02, "resumed_from": {"checkpoint": "c.pt", "epoch": 1,
                                                          "step": 16}, "steps_lost": 1}]}))
    assert main(["runs", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"failed (node1), recovered in {last.run_id}" in out, out
    assert "succeeded after 1 recovery" in out, out
    assert main(["runs", "show", first.run_id, "--runs-dir", str(tmp_path)]) == 0
    assert (f"  a node failed: the run started again as {last.run_id} (`runs show "
            f"{last.run_id}`)") in capsys.readouterr().out
    assert main(["runs", "show", last.run_id, "--runs-dir", str(tmp_path)]) == 0
    assert (f"  recovery 1: node1 lost (x) at T; node2 took its place, as {last.run_id} on "
            "node0, node2; training again 13.3 s later (torchrun restarted after 5.1 s, "
            "first step 6.8 s after that, checkpoint loaded in 0.02 s); resumed from c.pt "
            "(epoch 1, step 16, 1 step(s) done again)") in capsys.readouterr().out


def test_attach_and_stop_find_a_recovered_runs_latest_attempt(tmp_path: Path,
                                                               capsys) -> None:
    first = make_run(tmp_path, finished=False)
    assert latest_attempt(first) == first    # running: no summary yet
    first.write_summary(Summary.from_json({"status": "failed", "duration_s": 1.0,
                                           "recovered_in": f"{first.run_id}.r1"}))
    assert latest_attempt(first) == first    # the next attempt's record is not there yet
    last = RunDir(tmp_path, f"{first.run_id}.r1")
    last.create({"run_id": last.run_id, "nodes": ["node0"], "inventory": "inv.yml",
                 "node_commands": {"node0": {}}})
    assert latest_attempt(first) == last
    last.write_summary(Summary.from_json({"status": "failed", "duration_s": 1.0,
                                          "recovered_in": first.run_id}))
    assert latest_attempt(first) == last     # a loop (an edited record) ends the walk
    last.write_summary(Summary.from_json({"status": "succeeded", "duration_s": 1.0}))
    assert main(["attach", first.run_id, "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"run {first.run_id} recovered from a failed node as {last.run_id}" in out, out
    assert f"run {last.run_id} has ended (succeeded)" in out, out


def test_logs_all_and_one_node(tmp_path: Path, capsys) -> None:
    run = make_run(tmp_path, finished=True)
    assert main(["logs", run.run_id, "--runs-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "node0/rank0 | hello\nnode1/rank1 | world\n"
    assert main(["logs", run.run_id, "--node", "node1", "--runs-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "node1/rank1 | world\n"
    assert main(["logs", run.run_id, "--node", "node7", "--runs-dir", str(tmp_path)]) != 0
    assert "not on 'node7'" in capsys.readouterr().err


def test_logs_follow_until_summary(tmp_path: Path, capsys) -> None:
    run = make_run(tmp_path, finished=False)

    def later() -> None:
        time.sleep(1.0)
        with open(run.log("node0"), "a") as fh:
            fh.write("node0/rank0 | later line\n")
        time.sleep(0.6)
        run.write_summary(Summary.from_json({"status": "failed", "duration_s": 3}))

    t = threading.Thread(target=later)
    t.start()
    started = time.monotonic()
    assert main(["logs", run.run_id, "--follow", "--runs-dir", str(tmp_path)]) == 0
    t.join()
    assert time.monotonic() - started >= 1.5
    assert "node0/rank0 | later line" in capsys.readouterr().out


def test_unknown_run(tmp_path: Path, capsys) -> None:
    make_run(tmp_path, finished=True)
    assert main(["logs", "20990101-000000-000000", "--runs-dir", str(tmp_path)]) != 0
    assert "no run '20990101-000000-000000'" in capsys.readouterr().err


def test_runs_gives_a_doctor_runs_verdict_not_its_command_line(tmp_path: Path,
                                                                capsys) -> None:
    import json

    from orchestrator.workloads.doctor_run import DOCTOR_MODULE

    def doctor_run(suspects: list[dict] | None) -> RunDir:
        run = make_run(tmp_path, finished=True)
        info = {**run.info(), "script": DOCTOR_MODULE,
                "script_args": ["--addresses", "10.0.0.1,10.0.0.2", "--link-seconds", "1"]}
        run.run_json.write_text(json.dumps(info))
        if suspects is not None:
            run.write_json("doctor.json", {"suspects": suspects})
        return run

    named = doctor_run([{"node": "node1", "why": "sends at 0.1 x"},
                        {"node": "node1", "why": "link node0-node1"}])
    healthy = doctor_run([])
    cut = doctor_run(None)
    assert main(["runs", "--runs-dir", str(tmp_path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines[named.run_id].endswith("doctor: suspects node1")
    assert lines[healthy.run_id].endswith("doctor: no node named")
    assert "did not finish" in lines[cut.run_id]
    assert not any("--addresses" in line for line in lines.values())
    assert main(["runs", "show", named.run_id, "--runs-dir", str(tmp_path)]) == 0
    assert "doctor: suspects node1" in capsys.readouterr().out


def _modes(run: RunDir) -> dict[str, str]:
    """{path in RUN's directory ('.' for itself): its permission bits, in octal}."""
    return {str(p.relative_to(run.path)): oct(p.stat().st_mode & 0o777)
            for p in [run.path, *run.path.rglob("*")]}


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_a_runs_record_is_readable_by_its_owner_only_whatever_the_umask(
        tmp_path: Path, umask: int) -> None:
    """run.json holds the job's command and its --env values: on a shared machine the
    other users see none of the record, whatever the umask it was written under."""
    from orchestrator.record.progress import NodePoint, Point

    old = os.umask(umask)
    try:
        run = RunDir(tmp_path / "runs", new_run_id())
        run.create({"run_id": run.run_id, "nodes": ["node0"], "script": "ddp.py",
                    "script_args": [], "inventory": "inv.yml",
                    "spec": {"env": {"WANDB_API_KEY": "s3cret"}}})
        run.append_timeline([Point(t=1.0, nodes={"node0": NodePoint(0.1)})])
        # and its report
        write_summary(run, Summary.from_json({"status": "succeeded", "duration_s": 1.0}))
        run.write_json("doctor.json", {"suspects": []})
    finally:
        os.umask(old)
    modes = _modes(run)
    assert set(modes) == {".", "run.json", "timeline.jsonl", "summary.json", "report.html",
                          "doctor.json"}, modes
    assert modes.pop(".") == "0o700" and set(modes.values()) == {"0o600"}, modes
    assert run.info()["spec"]["env"] == {"WANDB_API_KEY": "s3cret"}


def test_a_record_written_wider_before_is_read_and_narrowed_when_written_again(
        tmp_path: Path) -> None:
    """A runs directory of an older version (0755, 0644) reads as it did; what is
    written into it again (a queued run's record, its timeline) is its owner's only."""
    from orchestrator.record.progress import NodePoint, Point

    run = make_run(tmp_path, finished=True)
    for path in (run.path, *run.path.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    run.timeline.write_text("")
    run.timeline.chmod(0o644)
    assert run.info()["script"] == "ddp.py"
    assert getattr(run.summary(), "status", None) == "succeeded"
    run.create({**run.info(), "queued": None}, queued=True)
    run.append_timeline([Point(t=1.0, nodes={"node0": NodePoint(0.1)})])
    modes = _modes(run)
    assert (modes["."], modes["run.json"], modes["timeline.jsonl"]) == \
        ("0o700", "0o600", "0o600")
    assert modes["summary.json"] == "0o644"   # not written again: as it was
