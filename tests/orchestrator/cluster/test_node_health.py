"""`nodes`: each node's state from its health verdict and cordon, its failures in the
window, the repeat offenders first, and the table a person reads (the sandbox's real
nodes: tests/roles/test_health_sandbox.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli.cmd_nodes import table
from orchestrator.cluster import node_health
from orchestrator.cluster.inventory import Cluster, NodeSpec
from orchestrator.cluster.node_health import NodeHealth, NodesReport, gather, ranked
from orchestrator.cluster.ssh import Result, SshTarget

from ..local_node import Canned

FAILING = {"node": "n3", "checked": 1000.0, "since": 900.0, "failing": [
    {"check": "share", "why": "the share /mnt/cluster did not answer within 10 s"}]}
WELL = {"node": "n1", "checked": 1000.0, "failing": []}
LOST = {"run": "r7", "time": 500.0, "by": "bob", "why": "n2 lost mid-run r7 (no word)"}


def report() -> NodesReport:
    nodes = [
        NodeHealth("n1", verdict=WELL),
        NodeHealth("n2", verdict=WELL, runs_failed=[LOST, {**LOST, "run": "r8"}],
                   cordon={"since": "2026-11-20T00:00:00+00:00", "held_by": ["bob"],
                           "why": LOST["why"]}),
        NodeHealth("n3", verdict=FAILING, events=[
            {"time": 900.0, "event": "failing", "failures": FAILING["failing"]}]),
        NodeHealth("n4", error="ssh: n4: connection refused"),
        NodeHealth("n5"),
    ]
    return NodesReport(ranked(nodes), since=0.0)


def test_each_nodes_state_and_the_repeat_offenders_first() -> None:
    r = report()
    assert [(n.name, n.state, n.failures) for n in r.nodes] == [
        ("n2", "cordoned", 2), ("n3", "failing", 1), ("n4", "not answering", 0),
        ("n5", "unchecked", 0), ("n1", "ok", 0)]


def test_the_table_says_why_each_node_is_out_and_lists_its_failures() -> None:
    lines = table(report())
    rows = {line.split()[0]: line for line in lines[2:7]}
    assert "by bob: n2 lost mid-run r7" in rows["n2"]
    assert "the share /mnt/cluster did not answer" in rows["n3"]
    assert "connection refused" in rows["n4"]
    assert "never ran here (run site.yml: roles/health)" in rows["n5"]
    assert rows["n1"].rstrip().endswith("-")
    events = lines[8:]
    assert len(events) == 3 and "health check failing: the share" in events[2]
    assert "run r7 (bob) lost it" in events[0]


def test_a_date_that_is_not_one_is_refused_naming_the_verb(capsys) -> None:
    """Before the inventory is read or any node asked: exit 2, the verb and the forms."""
    from orchestrator.cli import main

    assert main(["nodes", "--since", "yesterday", "-i", "/no/such/inventory.yml"]) == 2
    assert ("nodes --since 'yesterday': not a date; give YYYY-MM-DD or YYYY-MM-DDTHH:MM"
            in capsys.readouterr().err)


def test_a_node_that_answers_with_no_json_is_not_answering_and_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its row says which node and verb and what it said; the share's part, asked of the
    node that answered, says the same of it."""
    answers = {"n0": [Result(0, '{"state": {"node": "n0", "failing": []}}\n', ""),
                      Result(0, '{"state": {}, "cordoned": {', "")],
               "n1": [Result(0, "Welcome to n1\n", "")]}
    monkeypatch.setattr(node_health.ssh, "connect",
                        lambda name, target: Canned(answers[name].pop(0)))
    cluster = Cluster(Path("hosts.yml"), tuple(NodeSpec(n, SshTarget(n), n)
                                               for n in ("n0", "n1")))
    report = gather(cluster, since=0.0)
    rows = {n.name: n for n in report.nodes}
    assert rows["n1"].state == "not answering" and rows["n1"].error == (
        "n1: `node.py health` failed: its answer was not JSON: Welcome to n1")
    assert rows["n0"].state == "ok"
    assert report.share_error == ('n0: `node.py health` failed: its answer was cut short: '
                                  '{"state": {}, "cordoned": {')
