"""The phases of a run (orchestrator/run/lifecycle.py) that need no node: which nodes a
queued run connects to while Slurm grants its allocation."""

from __future__ import annotations

from pathlib import Path

from orchestrator.cluster.inventory import Cluster, NodeSpec
from orchestrator.cluster.ssh import SshTarget
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
