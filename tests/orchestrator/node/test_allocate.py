"""The parsing behind node/allocate.py, on `scontrol` output recorded on the sandbox's
Slurm cluster (slurm_records/). The allocation itself runs on the sandbox
(tests/orchestrator/run/test_queue_sandbox.py)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.node import allocate

RECORDS = Path(__file__).parent / "slurm_records"


def test_each_nodes_gpu_indices_from_scontrol() -> None:
    detail = (RECORDS / "scontrol-show-job-d.txt").read_text()
    assert allocate.gres_lines(detail) == [("node0", [0]), ("node1", [1]), ("node2", [0])]


def test_index_ranges() -> None:
    assert allocate.indices("0-1,3") == [0, 1, 3]
    assert allocate.indices("") == []


def test_gres_for_a_given_count() -> None:
    assert allocate.gres("2") == ["--gres=gpu:2"]
    assert allocate.gres("0") == []
