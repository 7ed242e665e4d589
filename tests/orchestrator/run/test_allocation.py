"""What train --queue asks Slurm for (orchestrator/run/allocation.py), and what each
node's ranks are told of the GPUs they were given."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from orchestrator.run.allocation import Allocation, AllocationRequest, hangup_interrupts


def test_the_request_as_the_node_verbs_and_salloc_options() -> None:
    assert AllocationRequest(nodes=2).node_request("j").argv() == [
        "--name", "j", "--", "-N", "2"]   # every GPU: the verb's default
    asked = AllocationRequest(hosts=("node0", "node2"), gpus_per_node=1, partition="gpu",
                              time="2:00:00", qos="high")
    assert asked.node_request("j").argv() == [
        "--name", "j", "--gpus-per-node", "1", "--", "-N", "2", "-w", "node0,node2",
        "--partition=gpu", "--time=2:00:00", "--qos=high"]


def test_each_node_sees_only_its_gpus() -> None:
    alloc = Allocation("23", ["node0", "node1"], {"node0": [0, 1], "node1": [1]}, 3.0)
    assert alloc.env("node1") == {"SLURM_JOB_ID": "23", "CLUSTERTRAIN_SLURM_JOB": "23",
                                  "CUDA_VISIBLE_DEVICES": "1"}
    assert alloc.gpus_per_node is None       # not the same count everywhere
    assert alloc.describe() == "node0 (GPUs 0,1), node1 (GPUs 1)"
    assert alloc.record() == {"job_id": "23", "nodes": ["node0", "node1"],
                              "gpus": {"node0": [0, 1], "node1": [1]}, "waited_s": 3.0}
    even = Allocation("24", ["node0"], {"node0": [0, 1]}, 0.0)
    assert even.gpus_per_node == 2


def queued_run(tmp_path, pid: int):  # noqa: ANN201 - the RunDir
    import os
    import socket

    from orchestrator.record.rundir import RunDir

    run = RunDir(tmp_path / "runs", "20261126-000000-abcdef")
    run.create({"run_id": run.run_id, "inventory": "hosts.yml", "nodes": [], "users": {},
                "script": "train.py", "script_args": [],
                "queued": {"host": socket.gethostname(), "pid": pid,
                           "since": "2026-11-26T07:00:00.000+00:00"}})
    assert os.path.isdir(run.path)
    return run


def test_a_queued_run_whose_train_is_gone_is_settled_not_left_queued(tmp_path, capsys) -> None:
    import os
    import subprocess
    import sys

    from orchestrator.cli import main
    from orchestrator.run.settle import settle

    waiting = queued_run(tmp_path, os.getpid())       # this process: its train still waits
    assert settle(waiting) is None
    assert main(["runs", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert " queued " in capsys.readouterr().out
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (waiting.path / "run.json").unlink()
    waiting.path.rmdir()
    dead = queued_run(tmp_path, int(gone.stdout))      # a train killed while it waited
    summary = settle(dead)
    assert summary is not None and summary.status == "controller-lost"
    assert "waited in Slurm's queue" in (summary.error or "")
    assert getattr(dead.summary(), "status", None) == "controller-lost"


def test_a_closed_terminal_ends_the_wait_as_ctrl_c_does() -> None:
    """SIGHUP or SIGTERM while queued: KeyboardInterrupt naming the signal (queue_for then
    cancels the job and records the run interrupted); the handlers are put back after."""
    before = signal.getsignal(signal.SIGHUP)
    for sig in (signal.SIGHUP, signal.SIGTERM):
        with pytest.raises(KeyboardInterrupt, match=sig.name), hangup_interrupts():
            os.kill(os.getpid(), sig)
            time.sleep(1.0)
    assert signal.getsignal(signal.SIGHUP) == before


def test_the_allocate_verb_copies_the_node_package_only_when_the_node_lacks_it(
        tmp_path) -> None:
    """The allocation starts the node's `allocate` at once (no round trip before it): a node
    without this version answers MISSING, gets the package and is asked again; a node that
    has it is asked once. Here the node has no Slurm client, which the verb itself says."""
    import json
    import sys

    from orchestrator.cluster import nodelib
    from orchestrator.node import requests as rq
    from orchestrator.run.allocation import _allocate_on
    from tests.orchestrator.local_node import LocalNode

    node = LocalNode(tmp_path)
    request = rq.Allocate(name="clustertrain-x", gpus_per_node="1", rest=("-N", "1"))
    for runs in (3, 1):
        node.runs.clear()
        proc, lines = _allocate_on(node, sys.executable, request)
        events = [json.loads(line) for line in lines]
        assert proc.wait() == 127 and events[0]["event"] == "refused", events
        assert "no Slurm client (sbatch)" in events[0]["said"][0]
        assert len(node.runs) == runs, node.runs
    assert Path(nodelib.entry(str(tmp_path))).is_file()
