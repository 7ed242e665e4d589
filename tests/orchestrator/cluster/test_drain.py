"""Which nodes a run keeps out (orchestrator/run/drain.py): the ones it lost, with why.
Cordoning and draining themselves run on the sandbox
(tests/e2e/test_cluster.py::test_killed_node_then_provision_again_and_resume)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from orchestrator.cluster.drain import KeptOut, cordon_event
from orchestrator.cluster.inventory import Cluster, NodeSpec
from orchestrator.cluster.ssh import Result, SshTarget
from orchestrator.node.answers import CordonAnswer
from orchestrator.node.cordon import CORDON
from orchestrator.record.summary import Summary
from orchestrator.run.recovery import keep_out_lost, lost_nodes

from ..local_node import Canned

SUMMARY = Summary.from_json({"run_id": "r1", "status": "failed", "duration_s": 1.0, "nodes": [
    {"name": "node0", "end_reason": "stopped", "why": "peer-lost node1"},
    {"name": "node1", "end_reason": "lost", "why": "heartbeat silent 15 s"},
    {"name": "node2", "end_reason": "exited"}]})


def test_only_the_lost_nodes_with_why() -> None:
    assert lost_nodes(SUMMARY) == {"node1": "heartbeat silent 15 s"}
    assert lost_nodes(Summary.from_json({"status": "failed", "duration_s": 1.0, "nodes": [
        {"name": "n", "end_reason": "lost"}]})) == {
        "n": "no word from it"}


def test_a_run_that_lost_no_node_keeps_nothing_out() -> None:
    said: list[str] = []
    cluster = Cluster(Path("hosts.yml"), (), variables={"cluster_scheduler": "slurm"})
    summary = replace(SUMMARY, nodes=SUMMARY.nodes[:1])
    assert keep_out_lost(summary, cluster, {}, said.append) == KeptOut()
    assert said == [] and KeptOut() == KeptOut({}, {})


def test_lost_nodes_with_no_other_node_to_ask_are_named_with_the_fix() -> None:
    said: list[str] = []
    cluster = Cluster(Path("hosts.yml"), (), variables={"cluster_scheduler": "none"})
    assert keep_out_lost(SUMMARY, cluster, {}, said.append) == KeptOut()
    assert said == ["run r1: could not cordon node1: no other node answers; once one "
                    "does: python -m orchestrator cordon NODE --why TEXT"]


def test_the_admin_group_is_the_inventorys_else_the_contracts() -> None:
    """Who may lift any cordon reaches the node verb from the inventory
    (cluster_admin_group), else from roles/contract's default, as the roles read it."""
    assert Cluster(Path("hosts.yml"), ()).admin_group == "sudo"
    assert Cluster(Path("hosts.yml"), (), variables={
        "cluster_admin_group": "wheel"}).admin_group == "wheel"


def test_a_cordon_answered_with_no_json_is_said_as_the_nodes_failure() -> None:
    """What keep_out says when the node cannot cordon ("could not cordon N: why"), not a
    traceback from the middle of a run's end."""
    cluster = Cluster(Path("hosts.yml"), ())
    asker = NodeSpec("node0", SshTarget("10.0.0.1"), "10.0.0.1")
    said = cordon_event(cluster, asker, Canned(Result(0, "Last login: today\n", "")),
                        "node1", CORDON, "lost", "r1")
    assert said == CordonAnswer(error="its answer was not JSON: Last login: today")
    failed = cordon_event(cluster, asker, Canned(Result(1, "", "OSError: read-only\n")),
                          "node1", CORDON, "lost", "r1")
    assert failed == CordonAnswer(error="OSError: read-only")


def test_uncordon_of_a_node_nothing_holds_is_done(tmp_path: Path, monkeypatch) -> None:
    """The real node program answers an uncordon with no cordon to lift with no event
    (`"event": null`): nothing held, nothing written, and `uncordon` returns it to service
    without an error (an answer typed more strictly once refused it, and doctor's tests,
    which uncordon the nodes they may have cordoned, failed on it)."""
    import sys

    from orchestrator.cluster import drain
    from orchestrator.cluster.ssh import SshTarget as Target

    from ..local_node import LocalNode, installed

    class Node(LocalNode):
        def close(self) -> None:
            pass

    home = tmp_path / "home"
    installed(home)
    share = tmp_path / "share"
    (share / "cordons").mkdir(parents=True, mode=0o1777)   # as the nfs_server role makes it
    cluster = Cluster(tmp_path / "hosts.yml", (
        NodeSpec("node0", Target("127.0.0.1"), "127.0.0.1", python=sys.executable),
        NodeSpec("node1", Target("127.0.0.2"), "127.0.0.2", python=sys.executable)),
        shared_path=str(share))
    monkeypatch.setattr(drain.ssh, "connect", lambda name, target: Node(home))
    assert drain.uncordon(cluster, "node1") == ""   # no Slurm: nothing more to say
