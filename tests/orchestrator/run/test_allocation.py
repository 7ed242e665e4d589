"""What train --queue asks Slurm for (orchestrator/run/allocation.py), and what each
node's ranks are told of the GPUs they were given."""

from __future__ import annotations

from orchestrator.run.allocation import Allocation, AllocationRequest


def test_the_request_as_salloc_options() -> None:
    assert AllocationRequest(nodes=2).salloc_args() == [
        "--gpus-per-node", "all", "--", "-N", "2"]
    assert AllocationRequest(hosts=("node0", "node2"), gpus_per_node=1, partition="gpu",
                             time="2:00:00", qos="high").salloc_args() == [
        "--gpus-per-node", "1", "--", "-N", "2", "-w", "node0,node2", "--partition=gpu",
        "--time=2:00:00", "--qos=high"]


def test_each_node_sees_only_its_gpus() -> None:
    alloc = Allocation("23", ["node0", "node1"], {"node0": [0, 1], "node1": [1]}, 3.0)
    assert alloc.env("node1") == {"SLURM_JOB_ID": "23", "CUDA_VISIBLE_DEVICES": "1"}
    assert alloc.gpus_per_node is None       # not the same count everywhere
    assert alloc.describe() == "node0 (GPUs 0,1), node1 (GPUs 1)"
    assert alloc.record() == {"job_id": "23", "nodes": ["node0", "node1"],
                              "gpus": {"node0": [0, 1], "node1": [1]}, "waited_s": 3.0}
    even = Allocation("24", ["node0"], {"node0": [0, 1]}, 0.0)
    assert even.gpus_per_node == 2
