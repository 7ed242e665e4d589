"""Which nodes a run drains in Slurm (orchestrator/run/drain.py): the ones it lost, and
only on a Slurm cluster. Draining itself runs on the sandbox
(tests/e2e/test_cluster.py::test_killed_node_then_provision_again_and_resume)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.cluster.inventory import Cluster
from orchestrator.run.drain import drain_lost, lost_nodes

SUMMARY = {"run_id": "r1", "nodes": [
    {"name": "node0", "end_reason": "stopped", "why": "peer-lost node1"},
    {"name": "node1", "end_reason": "lost", "why": "heartbeat silent 15 s"},
    {"name": "node2", "end_reason": "exited"}]}


def test_only_the_lost_nodes_with_why() -> None:
    assert lost_nodes(SUMMARY) == {"node1": "heartbeat silent 15 s"}
    assert lost_nodes({"nodes": [{"name": "n", "end_reason": "lost"}]}) == {
        "n": "no word from it"}


def test_nothing_is_drained_without_slurm() -> None:
    said: list[str] = []
    cluster = Cluster(Path("hosts.yml"), (), variables={"cluster_scheduler": "none"})
    assert drain_lost(SUMMARY, cluster, {}, said.append) == {}
    assert said == []
