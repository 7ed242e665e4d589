"""`each`: one fan-out over nodes with a result per node."""

from __future__ import annotations

import threading

import pytest

from orchestrator.cluster.fanout import each


def test_every_node_runs_at_once_and_each_keeps_its_result_or_error() -> None:
    barrier = threading.Barrier(4, timeout=10)  # passes only if all four run together

    def work(n: int) -> int:
        barrier.wait()
        if n % 2:
            raise ValueError(f"node{n} broke")
        return n * 10

    results = each(range(4), work, lambda n: f"node{n}")
    assert list(results) == ["node0", "node1", "node2", "node3"]
    assert results["node0"].value == 0 and results["node2"].value == 20
    assert {n: str(e) for n, e in results.failed.items()} == {"node1": "node1 broke",
                                                              "node3": "node3 broke"}
    with pytest.raises(ValueError, match="node1 broke"):  # the first in the nodes' order
        results.values_or_raise()


def test_values_of_a_group_without_failures_and_of_no_nodes() -> None:
    assert each(["a", "b"], str.upper, str).values_or_raise() == {"a": "A", "b": "B"}
    assert each([], str.upper, str) == {}


def test_limit_caps_how_many_run_at_once() -> None:
    running, most = [0], [0]
    lock = threading.Lock()

    def work(_: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        threading.Event().wait(0.05)
        with lock:
            running[0] -= 1

    each(range(6), work, str, limit=2)
    assert most[0] <= 2
