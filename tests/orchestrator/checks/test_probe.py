"""What preflight makes of a node's answer to its questions (orchestrator/checks/probe.py)
when the answer is broken: the node's failure, as when the node program fails. The real
probes run on the sandbox (test_preflight_sandbox.py)."""

from __future__ import annotations

from typing import cast

from orchestrator.checks.probe import Rendezvous, probe, reach, stop_listener
from orchestrator.cluster.inventory import NodeSpec
from orchestrator.cluster.ssh import Connection, Result, SshTarget
from orchestrator.node.answers import ReachAnswer

from ..local_node import Canned

NODE = NodeSpec("node1", SshTarget("10.0.0.2"), "10.0.0.2", python="/usr/bin/python3")
GARBAGE = Result(0, "Welcome to node1\n", "")


def conn(result: Result) -> Connection:
    return cast(Connection, Canned(result))


def test_a_probe_answered_with_no_json_is_the_nodes_failure() -> None:
    facts = probe(NODE, conn(GARBAGE), shared={"path": "/mnt/s", "fstypes": None},
                  addresses=[], port=None)
    assert facts.error == ("probe failed with /usr/bin/python3: its answer was not JSON: "
                           "Welcome to node1")
    failed = probe(NODE, conn(Result(1, "", "ImportError: x\n")),
                   shared={"path": "/mnt/s", "fstypes": None}, addresses=[], port=None)
    assert failed.error == "probe failed with /usr/bin/python3: ImportError: x"


def test_a_reach_answered_with_no_json_is_its_error_and_a_stop_finds_no_strangers() -> None:
    rendezvous = Rendezvous.new(2)
    cut = Result(0, '{"reached": true, "token"', "")
    assert reach(NODE, conn(cut), addr="10.0.0.1", port=29500, rendezvous=rendezvous,
                 shared_path="/mnt/s") == ReachAnswer(
        error='its answer was cut short: {"reached": true, "token"')
    assert stop_listener(NODE, conn(GARBAGE), 29500, rendezvous) == []
    assert stop_listener(NODE, conn(Result(0, '{"strangers": [{"from": "10.0.0.9"}]}', "")),
                         29500, rendezvous) == [{"from": "10.0.0.9"}]
