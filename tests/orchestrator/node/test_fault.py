"""A node's fault is one rule (orchestrator/node/fault.py): the controller reads it from a
run's summary (run/recovery.py, an attached run), the nodes from a failed peer's state on
the share (node/recover.py, a detached run), and both recover from the same ends, in the
same words."""

from __future__ import annotations

import pytest

from orchestrator.node import recover
from orchestrator.node.protocol import PEER_TIMEOUT, End
from orchestrator.record.summary import Summary
from orchestrator.run.recovery import node_failure


def controller_says(state: dict) -> str | None:
    """What the controller makes of node1's end as its summary records it."""
    summary = {"run_id": "r", "status": "failed", "duration_s": 1.0, "first_failed": "node1",
               "end": "2026-11-26T03:00:10+00:00",
               "nodes": [{"name": "node0", "exit_code": -15, "end_reason": "stopped"},
                         {"name": "node1", "exit_code": state.get("code"),
                          "end_reason": state["reason"], "why": state.get("why", "")}]}
    failure = node_failure(Summary.from_json(summary))
    return failure.why if failure else None


@pytest.mark.parametrize("state", [
    {"reason": "supervisor-failed", "why": "OSError"},
    {"reason": "supervisor-failed"},                 # no reason given
    {"reason": "exited", "code": 137},               # SIGKILL, as the supervisor writes it
    {"reason": "exited", "code": 135},               # SIGBUS
    {"reason": "exited", "code": -9},                # SIGKILL, as Python says it
    {"reason": "exited", "code": 143},               # a stop: nobody's fault
    {"reason": "exited", "code": 130},
    {"reason": "exited", "code": 1},                 # the script's
    {"reason": "exited", "code": 0},
])
def test_the_controller_and_the_nodes_blame_a_node_for_the_same_ends(state: dict) -> None:
    on_the_nodes = recover.fault(End.PEER_FAILED, "node1", state)
    assert controller_says(state) == on_the_nodes


def test_a_lost_node_is_said_alike_by_the_controller_and_its_peers() -> None:
    peers = recover.fault(End.PEER_LOST, "node1", {})
    assert peers == f"lost (no word from it for {PEER_TIMEOUT:g} s)"
    assert controller_says({"reason": "lost",
                            "why": f"no word from it for {PEER_TIMEOUT:g} s"}) == peers
