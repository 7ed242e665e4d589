"""The sweep's record, its table and how trials become runs (orchestrator/sweep/): the
parts that need no node. A sweep run for real: test_sweep_sandbox.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.record.summary import Summary
from orchestrator.run.spec import RunSpec
from orchestrator.sweep.record import TrialRecord, TrialState, new_sweep, open_sweep
from orchestrator.sweep.runner import default_parallel, nodes_per_trial, trial_spec
from orchestrator.sweep.sweepfile import Parameter, SweepSpec
from orchestrator.sweep.table import change_line, table

INVENTORY = """\
all:
  children:
    train_nodes:
      hosts:
        hpc-a: {cluster_address: 10.0.0.1}
        hpc-b: {cluster_address: 10.0.0.2}
        hpc-c: {cluster_address: 10.0.0.3}
        hpc-d: {cluster_address: 10.0.0.4}
        hpc-e: {cluster_address: 10.0.0.5}
"""
SWEEP = SweepSpec("grid", (Parameter("--lr", ("0.1", "0.01")), Parameter("--width", ("4", "8"))),
                  "test_loss")


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY)
    return path


def test_each_trial_is_the_job_with_its_parameters_after_the_scripts_own(
        tmp_path: Path, inventory: Path) -> None:
    record = new_sweep(tmp_path / "runs", tmp_path / "s.yaml", SWEEP, SWEEP.expand(), 2)
    base = RunSpec(inventory=inventory, nodes=2, script_args=("--epochs", "2"))
    first = record.trials[2]
    spec = trial_spec(base, record, first, ["hpc-c", "hpc-d"])
    assert spec.script_args == ("--epochs", "2", "--lr", "0.01", "--width", "4")
    assert spec.run_id == f"{record.sweep_id}.t3"
    assert spec.env == {"SWEEP_TRIAL": f"{record.sweep_id}.t3"}   # the same on resume
    assert (spec.hosts, spec.nodes, spec.runs_dir) == (("hpc-c", "hpc-d"), None,
                                                        tmp_path / "runs")
    first.tries = 1   # resumed: a run of its own again
    assert trial_spec(base, record, first, None).run_id == f"{record.sweep_id}.t3.2"
    assert trial_spec(base, record, first, None).nodes == 2   # the queue chooses nodes
    assert trial_spec(base, record, first, None).env["SWEEP_TRIAL"] == f"{record.sweep_id}.t3"


def test_without_the_queue_trials_share_out_whole_nodes(inventory: Path) -> None:
    assert nodes_per_trial(RunSpec(inventory=inventory, nodes=2)) == (
        ["hpc-a", "hpc-b", "hpc-c", "hpc-d", "hpc-e"], 2)
    assert default_parallel(RunSpec(inventory=inventory, nodes=2), 12) == 2
    assert default_parallel(RunSpec(inventory=inventory, nodes=1), 3) == 3
    assert default_parallel(RunSpec(inventory=inventory), 12) == 1   # every node each
    hosts = RunSpec(inventory=inventory, hosts=("hpc-e", "hpc-a"), nodes=None)
    assert nodes_per_trial(hosts) == (["hpc-e", "hpc-a"], 2)
    queued = RunSpec(inventory=inventory, nodes=1, queue=True, gpus_per_node=1)
    assert nodes_per_trial(queued) == (None, 1) and default_parallel(queued, 12) == 12


def test_the_record_ranks_the_best_first_and_reads_back(tmp_path: Path) -> None:
    record = new_sweep(tmp_path, tmp_path / "s.yaml", SWEEP, SWEEP.expand(), 2)
    assert oct(os.stat(record.path).st_mode & 0o777) == "0o700"
    for trial, metric, state in zip(record.trials, (0.3, None, 0.1, 0.2),
                                    ("succeeded", "failed", "succeeded", "succeeded"),
                                    strict=True):
        trial.metric, trial.state = metric, TrialState(state)
        trial.started, trial.ended = 100.0, 112.5
    record.save()
    again = open_sweep(tmp_path, record.sweep_id)
    assert [t.number for t in again.ranked()] == [3, 4, 1, 2]
    again.goal = "maximize"
    assert [t.number for t in again.ranked()] == [1, 4, 3, 2]
    assert table(open_sweep(tmp_path, record.sweep_id), ranked=True) == [
        "TRIAL  --lr  --width  NODES  STATE      DURATION  TEST_LOSS",
        "t3     0.01  4        -      succeeded  12.5 s    0.1",
        "t4     0.01  8        -      succeeded  12.5 s    0.2",
        "t1     0.1   4        -      succeeded  12.5 s    0.3",
        "t2     0.1   8        -      failed     12.5 s    -"]


def test_a_change_is_one_line() -> None:
    from orchestrator.sweep.record import SweepRecord
    record = SweepRecord("s1", Path("/r"), "/s.yaml", "test_loss", "minimize", 2, 3, 0.0, [])
    t = TrialRecord(2, [("--lr", "0.1")], run_id="s1.t2", state=TrialState.RUNNING,
                    nodes=["hpc-b"], started=10.0)
    assert change_line(record, t) == "t2 --lr 0.1: started on hpc-b as run s1.t2"
    t.state, t.ended, t.metric = TrialState.SUCCEEDED, 200.0, 0.25
    assert change_line(record, t) == "t2 --lr 0.1: succeeded after 3.2 min, test_loss 0.25"
    t.state, t.metric, t.why = TrialState.FAILED, None, "node0 exited with code 3"
    assert change_line(record, t) == "t2 --lr 0.1: failed after 3.2 min: node0 exited with code 3"


def test_a_sweep_that_cannot_be_is_refused_before_anything_is_recorded(
        tmp_path: Path, inventory: Path, capsys) -> None:
    runs = tmp_path / "runs"
    sweep = ("sweep:\n  method: grid\n  parameters: {--lr: [0.1]}\n  metric: loss\n")
    for job, said in ((f"inventory: {inventory}\ndetach: true\n",
                       "detach: a sweep follows its trials to their end"),
                      (f"inventory: {inventory}\nrun_id: mine\n",
                       "run_id: the sweep names its trials' runs")):
        path = tmp_path / "s.yaml"
        path.write_text(job + sweep)
        assert main(["sweep", "-f", str(path), "--runs-dir", str(runs)]) != 0
        assert said in capsys.readouterr().err
    assert main(["sweep", "--runs-dir", str(runs)]) != 0
    assert "sweep needs a sweep file" in capsys.readouterr().err
    assert main(["sweep", "show", "nope", "--runs-dir", str(runs)]) != 0
    assert f"no sweep 'nope' in {runs}/" in capsys.readouterr().err
    assert not runs.exists()


def test_show_json_lists_the_trials_best_first(tmp_path: Path, capsys) -> None:
    record = new_sweep(tmp_path, tmp_path / "s.yaml", SWEEP, SWEEP.expand(), 2)
    record.trials[1].metric, record.trials[1].state = 0.5, TrialState.SUCCEEDED
    record.state = "ended"
    record.save()
    assert main(["sweep", "show", record.sweep_id, "--runs-dir", str(tmp_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [t["number"] for t in shown["trials"]][:1] == [2]
    assert shown["trials"][0]["values"] == [["--lr", "0.1"], ["--width", "8"]]


def test_a_metric_no_trial_printed_is_named_with_the_keys_they_did(
        tmp_path: Path, inventory: Path) -> None:
    from orchestrator.sweep.runner import Sweep
    record = new_sweep(tmp_path, tmp_path / "s.yaml", SWEEP, SWEEP.expand(), 2)
    said: list[str] = []
    sweep = Sweep(record, RunSpec(inventory=inventory, nodes=1), said.append)
    sweep.missing_metric = {3: ["accuracy", "loss"], 1: ["loss"]}
    sweep._say_missing_metric()
    assert said == [f"sweep {record.sweep_id}: the metric 'test_loss' was not in the "
                    "FINAL_METRICS of t1, t3: they printed accuracy, loss; set metric: to one "
                    "of them"]


def test_a_sweep_whose_process_is_gone_is_settled_from_its_trials_runs(
        tmp_path: Path, capsys) -> None:
    """Its record says running, its process is gone: `show` takes each trial's state from
    its run's summary, keeps `running` a trial whose run has none yet (its train is a
    process of its own), and `resume` refuses until that run has ended."""
    import socket
    import subprocess
    import sys

    from orchestrator.record.rundir import RunDir
    record = new_sweep(tmp_path, tmp_path / "s.yaml", SWEEP, SWEEP.expand(), 2)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    record.host, record.pid, record.state = socket.gethostname(), int(gone.stdout), "running"
    for t, n in zip(record.trials[:2], (1, 2), strict=True):
        t.state, t.run_id = TrialState.RUNNING, f"{record.sweep_id}.t{n}"
    ended = RunDir(tmp_path, f"{record.sweep_id}.t1")
    ended.create({"run_id": ended.run_id, "nodes": ["hpc-a"]})
    ended.write_summary(Summary.from_json({"status": "failed", "duration_s": 3.0}))
    record.save()
    assert main(["sweep", "show", record.sweep_id, "--runs-dir", str(tmp_path)]) == 0
    settled = open_sweep(tmp_path, record.sweep_id)
    assert [t.state.value for t in settled.trials] == ["failed", "running", "not run",
                                                       "not run"]
    assert (settled.state, settled.why) == ("stopped", "its process is gone")
    capsys.readouterr()
    assert main(["sweep", "resume", record.sweep_id, "--runs-dir", str(tmp_path)]) != 0
    assert f"the run of t2 ({record.sweep_id}.t2) has not ended" in capsys.readouterr().err
    # t2's run ends later: its end is read then (the sweep stopped long ago), so `show`
    # stops saying running and `resume` no longer waits for it.
    later = RunDir(tmp_path, f"{record.sweep_id}.t2")
    later.create({"run_id": later.run_id, "nodes": ["hpc-a"]})
    later.write_summary(Summary.from_json({"status": "succeeded", "duration_s": 9.0}))
    assert main(["sweep", "show", record.sweep_id, "--runs-dir", str(tmp_path)]) == 0
    assert [t.state.value for t in open_sweep(tmp_path, record.sweep_id).trials] == [
        "failed", "succeeded", "not run", "not run"]


def test_the_nodes_a_sweep_can_have_pass_the_door(inventory: Path) -> None:
    """More trials, or a larger `parallel`, than fit at once is no refusal (they wait their
    turn); `hosts` with `nodes` shares out those hosts."""
    from orchestrator.sweep.runner import check_nodes
    for spec in (RunSpec(inventory=inventory, nodes=5), RunSpec(inventory=inventory),
                 RunSpec(inventory=inventory, hosts=("hpc-e", "hpc-a", "hpc-c"), nodes=2),
                 RunSpec(inventory=inventory, hosts=("hpc-b",))):
        check_nodes(spec)
