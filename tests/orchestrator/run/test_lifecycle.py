"""The phases of a run (orchestrator/run/lifecycle.py) that need no node: which nodes a
queued run connects to while Slurm grants its allocation, and how its nodes are checked
once granted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.cluster.inventory import Cluster, NodeSpec
from orchestrator.cluster.ssh import SshTarget
from orchestrator.errors import PreflightError
from orchestrator.record.rundir import RunDir
from orchestrator.run import lifecycle
from orchestrator.run.allocation import Allocation
from orchestrator.run.lifecycle import _nodes_ahead
from orchestrator.run.spec import RunSpec


def inventory(n: int) -> Cluster:
    return Cluster(Path("hosts.yml"), tuple(
        NodeSpec(f"node{i}", SshTarget(f"192.0.2.{i + 1}"), f"192.0.2.{i + 1}")
        for i in range(n)))


def ahead(whole: Cluster, asked: Cluster, **spec: object) -> list[str] | None:
    found = _nodes_ahead(RunSpec(script="train.py", **spec), whole, asked)  # type: ignore[arg-type]
    return None if found is None else found.names


def test_a_queued_run_connects_ahead_where_slurm_looks_first() -> None:
    """While Slurm grants, a --queue run opens the connections its check will want: to the
    first twice-as-many nodes (Slurm's first choice on an idle cluster), or to the --hosts
    named; never to the inventory's first node, which the allocation itself is connected
    to; nothing for a run that does not queue."""
    eight, three = inventory(8), inventory(3)
    assert ahead(eight, eight.select(nodes=2), queue=True) == ["node1", "node2", "node3"]
    assert ahead(eight, eight.select(nodes=8), queue=True) == [f"node{i}" for i in range(1, 8)]
    assert ahead(three, three.select(nodes=2), queue=True) == ["node1", "node2"]
    assert ahead(eight, eight.select(hosts="node0,node5"), queue=True,
                 hosts=("node0", "node5")) == ["node5"]
    assert ahead(inventory(1), inventory(1), queue=True) is None
    assert ahead(eight, eight.select(nodes=2)) is None


class Checked(Exception):
    """Raised by the stand-in check: what the run asked of it is all the test needs."""

    def __init__(self, asked: dict[str, Any]) -> None:
        super().__init__("checked")
        self.asked = asked


def check_of(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **spec: Any) -> dict[str, Any]:
    """What a run of SPEC on a one-node inventory asks of its nodes' check (Session.check's
    options); a --queue run is granted node0 (GPUs 0, 1) as Slurm job 42."""
    granted = Allocation("42", ["node0"], {"node0": [0, 1]}, 0.0)
    monkeypatch.setattr(lifecycle, "queue_for", lambda *a, **k: granted)

    def check(cluster: Cluster, **asked: Any) -> None:
        raise Checked(asked)

    monkeypatch.setattr(lifecycle.Session, "check", check)
    one = inventory(1)
    with pytest.raises(Checked) as checked:
        lifecycle._attempt(RunSpec(script="train.py", runs_dir=tmp_path, **spec), one, one,
                           "20260101-000000-abcdef", dry_run=False)
    return checked.value.asked


def test_a_queued_runs_check_is_not_told_to_share_gpus(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """Issue 69: --queue is no --share-gpus. The check is told the GPUs Slurm gave the run
    (its nodes' Slurm jobs are Slurm's to share out), and refuses a node that a run
    started outside Slurm uses, unless the user asked for --share-gpus."""
    queued = check_of(monkeypatch, tmp_path, queue=True)
    assert (queued["share_gpus"], queued["queued_gpus"]) == (False, {"node0": [0, 1]})
    assert check_of(monkeypatch, tmp_path, queue=True, share_gpus=True)["share_gpus"] is True
    plain = check_of(monkeypatch, tmp_path)
    assert (plain["share_gpus"], plain["queued_gpus"]) == (False, None)


def test_a_queued_run_its_check_refuses_after_the_grant_is_recorded_as_failed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Slurm granted the run a node that a run outside Slurm uses and its check refused
    it: its record (written while it waited) gets a summary saying why, not none (which
    `runs` would settle as a lost train)."""
    run_id = "20260101-000000-abcdef"

    def granted(spec: RunSpec, *args: Any) -> Allocation:
        RunDir(spec.runs_dir, run_id).create({
            "run_id": run_id, "inventory": "hosts.yml", "nodes": [], "users": {},
            "script": "train.py", "script_args": [], "queued": {"host": "h", "pid": 1}})
        return Allocation("42", ["node0"], {"node0": [0]}, 0.0)

    def refused(cluster: Cluster, **asked: Any) -> None:
        raise PreflightError("preflight found 1 blocking problem(s); nothing was started:\n"
                             "  node0 is in use by alice's run R, started outside Slurm")

    monkeypatch.setattr(lifecycle, "queue_for", granted)
    monkeypatch.setattr(lifecycle.Session, "check", refused)
    one = inventory(1)
    with pytest.raises(PreflightError):
        lifecycle._attempt(RunSpec(script="train.py", runs_dir=tmp_path, queue=True), one, one,
                           run_id, dry_run=False)
    summary = RunDir(tmp_path, run_id).summary()
    assert summary is not None
    assert summary.status == "failed"
    assert (summary.error or "").endswith("node0 is in use by alice's run R, started outside Slurm")
