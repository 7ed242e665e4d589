"""The tutorial's resume on the real-site sandbox: PyTorch's multinode.py shape (a snapshot
in the working directory, resumed when found), launched twice on 3 nodes as alice with
more epochs the second time, goes on where the first run ended, as it does with torchrun
run by hand in one directory."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ...cluster import ProvisionedCluster as Sandbox
from .test_train_sandbox import Train

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1500)]
TUTORIAL = Path(__file__).resolve().parents[1] / "jobs" / "tutorial"


def test_the_tutorials_second_launch_resumes_from_its_snapshot(sandbox_cluster: Sandbox,
                                                               tmp_path: Path) -> None:
    work = tmp_path / "tutorial"   # a work directory of its own: no earlier run of it
    shutil.copytree(TUTORIAL, work)
    first = Train(sandbox_cluster, tmp_path / "runs", "--nodes", "3", "--workdir",
                  str(work), "multinode.py", "--", "2", "1")
    assert first.finish(timeout=400) == 0, first.text[-3000:] + first.stderr
    assert "Resuming" not in first.text and first.text.count("Training snapshot saved") == 6
    second = Train(sandbox_cluster, tmp_path / "runs2", "--nodes", "3", "--workdir",
                   str(work), "multinode.py", "--", "4", "1")
    assert second.finish(timeout=400) == 0, second.text[-3000:] + second.stderr
    # every node's local rank 0 saved its own snapshot.pt, and every rank resumed from it
    assert second.text.count("Resuming training from snapshot at Epoch 2") == 3, second.text
    epochs = {int(m) for m in re.findall(r"\] Epoch (\d+) \| Steps", second.text)}
    assert epochs == {2, 3}, second.text
    said = [line for _, line in second.lines if "the last run from this work directory" in line]
    assert said and "node0, node1, node2" in said[0] and "snapshot.pt" in said[0], said
