"""Progress of a run from its workers' lines: beats, quiet time, stragglers."""

from __future__ import annotations

import pytest

from orchestrator.progress import MIN_STEPS, Beat, Progress, parse_beat


@pytest.mark.parametrize("text, beat", [
    ("##clustertrain beat", Beat()),
    ("##clustertrain beat step_s=0.25 samples=64", Beat(0.25, 64)),
    ("##clustertrain beat step_s=abc samples=64", Beat(None, 64)),
    ("##clustertrain beat step_s=-1", Beat()),
    ("##clustertrain beat step_s=inf", Beat()),
    ("##clustertrain beats", None),
    ("epoch 1 step 3 loss 0.5", None),
    ("  ##clustertrain beat", None),
])
def test_beat_lines_are_read_and_other_lines_are_not_beats(text, beat) -> None:
    assert parse_beat(text) == beat


def test_any_line_is_progress_and_only_beats_are_hidden() -> None:
    p = Progress(now=100.0)
    assert p.quiet_for(130.0) == 30.0
    assert p.line("node0", 0, "loss 0.5", now=125.0) is False   # shown, and progress
    assert p.quiet_for(130.0) == 5.0
    assert p.line("node1", 1, "##clustertrain beat", now=129.0) is True
    assert p.quiet_for(130.0) == 1.0
    p.output(now=129.5)  # a part of a line: a progress bar redrawn with \r
    assert p.quiet_for(130.0) == 0.5


def feed(p: Progress, node: str, rank: int, step_s: float, n: int = MIN_STEPS,
         samples: int | None = 32) -> None:
    for _ in range(n):
        extra = f" samples={samples}" if samples is not None else ""
        p.line(node, rank, f"##clustertrain beat step_s={step_s}{extra}", now=0.0)


def test_a_node_whose_rank_is_slower_than_the_median_by_20_percent_is_a_straggler() -> None:
    p = Progress(now=0.0)
    for node, rank, step_s in (("node0", 0, 0.100), ("node0", 1, 0.104), ("node1", 2, 0.098),
                               ("node1", 3, 0.102), ("node2", 4, 0.150), ("node2", 5, 0.101)):
        feed(p, node, rank, step_s)
    [s] = p.stragglers()
    assert (s.node, s.rank) == ("node2", 4)
    assert s.message().startswith("node2 is 48 % slower than the median step time")


def test_no_straggler_within_20_percent_nor_before_enough_steps() -> None:
    p = Progress(now=0.0)
    feed(p, "node0", 0, 0.100)
    feed(p, "node1", 1, 0.118)
    assert p.stragglers() == []
    q = Progress(now=0.0)
    feed(q, "node0", 0, 0.1)
    feed(q, "node1", 1, 0.5, n=MIN_STEPS - 1)  # too few steps to judge
    assert q.stragglers() == []


def test_one_node_alone_is_never_a_straggler() -> None:
    p = Progress(now=0.0)
    feed(p, "node0", 0, 0.1)
    feed(p, "node0", 1, 0.5)
    assert p.stragglers() == []


def test_summary_gives_each_nodes_step_time_and_samples_per_second() -> None:
    p = Progress(now=0.0)
    feed(p, "node0", 0, 0.5, samples=64)
    feed(p, "node0", 1, 0.25, samples=64)
    feed(p, "node1", 2, 0.5, samples=None)
    data = p.to_json()
    assert data["nodes"] == {"node0": {"step_s": 0.5, "samples_per_s": 384.0},
                             "node1": {"step_s": 0.5}}
    assert data["stragglers"] == []
