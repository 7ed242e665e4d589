"""The nodes' system samples as the controller keeps them (record/system.py): read from
a node's line, kept in the timeline beside the progress points without either being
taken for the other, and the flags: a node close to running out of memory, a GPU idle for
minutes."""

from __future__ import annotations

import json

import pytest

from orchestrator.node.sysmetrics import Gpu
from orchestrator.record.progress import NodePoint, Point
from orchestrator.record.system import (
    GIB,
    FlagKind,
    Sample,
    SystemWatch,
    flags_of,
    parse_system,
)

LINE = ('{"t":1000.5,"cpu_pct":37.5,"mem_total":%d,"mem_available":%d,"job_rss":%d,'
        '"net":{"iface":"eth0","rx_bps":1200000,"tx_bps":800000},'
        '"gpus":[{"index":0,"util_pct":0.0,"mem_used":1073741824,"mem_total":85520809984}]}')


def sample(node: str = "node0", t: float = 0.0, available: float = 0.5, rss: float = 0.1,
           util: float | None = None) -> Sample:
    total = 64 * GIB
    gpus = (Gpu(0, util, GIB, 80 * GIB),) if util is not None else ()
    return Sample(node, t, 10.0, total, int(available * total), int(rss * total), 0.0, 0.0,
                  gpus)


def test_a_nodes_line_reads_and_keeps_its_place_in_the_timeline() -> None:
    s = parse_system("node1", LINE % (64 * GIB, 48 * GIB, 8 * GIB))
    assert s is not None
    assert (s.node, s.t, s.cpu_pct, s.job_rss, s.rx_bps, s.tx_bps) == \
        ("node1", 1000.5, 37.5, 8 * GIB, 1.2e6, 8e5)
    assert s.mem_pct == pytest.approx(25.0)
    assert s.gpus == (Gpu(0, 0.0, GIB, 85520809984),)
    line = json.loads(json.dumps(s.to_json()))
    assert Sample.from_json(line) == s
    # Each reader of timeline.jsonl takes only its own lines.
    with pytest.raises((KeyError, TypeError, ValueError)):
        Point.from_json(line)
    point = Point(1000.0, {"node1": NodePoint(0.25)}).to_json()
    with pytest.raises((KeyError, TypeError, ValueError)):
        Sample.from_json(point)
    # A line cut short, or fields the node could not read.
    assert parse_system("node1", LINE[:40]) is None
    bare = parse_system("node1", '{"t": 5}')
    assert bare == Sample("node1", 5.0) and bare.mem_pct is None


def test_a_node_close_to_running_out_of_memory_is_flagged_once() -> None:
    watch = SystemWatch()
    assert watch.feed(sample(available=0.06)) == []
    (flag,) = watch.feed(sample(t=10, available=0.04))
    assert flag.kind == FlagKind.MEMORY and flag.node == "node0"
    assert flag.message == ("node0 is close to running out of memory: 2.6 GiB of 64.0 GiB "
                            "available, the job's processes hold 6.4 GiB")
    assert watch.feed(sample(t=20, available=0.01)) == []   # said once
    # The job's own processes holding over 90 % of the node, in another node.
    (flag,) = watch.feed(sample("node1", 20, available=0.06, rss=0.92))
    assert flag.node == "node1"
    assert [f.node for f in watch.flags] == ["node0", "node1"]


def test_the_idle_time_is_the_runs_own_and_0_flags_no_gpu() -> None:
    """train --gpu-idle 20: flagged after 20 s, said in seconds; --gpu-idle 0: never."""
    watch, never = SystemWatch(20.0), SystemWatch(0.0)
    for t in (0, 10):
        assert watch.feed(sample(t=t, util=0.0)) == [] and never.feed(sample(t=t)) == []
    (flag,) = watch.feed(sample(t=20, util=0.0))
    assert flag.message == "node0 GPU 0 idle (0 % used) for 20 s while the run trains"
    assert all(never.feed(sample(t=t, util=0.0)) == [] for t in range(20, 4000, 10))


def test_a_gpu_idle_for_minutes_is_flagged_once_and_a_busy_sample_starts_over() -> None:
    watch = SystemWatch()
    # Idle for 170 s, then busy once, then idle again: not yet.
    for t in range(0, 180, 10):
        assert watch.feed(sample(t=t, util=0.0)) == []
    assert watch.feed(sample(t=180, util=55.0)) == []
    for t in range(190, 190 + 180, 10):
        assert watch.feed(sample(t=t, util=0.5)) == []
    (flag,) = watch.feed(sample(t=190 + 180, util=0.0))
    assert (flag.kind, flag.node, flag.gpu) == (FlagKind.GPU_IDLE, "node0", 0)
    assert flag.message == "node0 GPU 0 idle (0 % used) for 3 minutes while the run trains"
    assert flag.to_json() == {"node": "node0", "kind": "gpu-idle", "t": 370.0,
                              "message": flag.message, "gpu": 0}
    assert watch.feed(sample(t=400, util=0.0)) == []
    # The same rule over a run's samples, in any order (a live run's report).
    samples = [sample(t=t, util=0.0) for t in range(0, 200, 10)]
    assert [f.to_json() for f in flags_of(samples[::-1])] == [
        {"node": "node0", "kind": "gpu-idle", "t": 180.0, "gpu": 0,
         "message": "node0 GPU 0 idle (0 % used) for 3 minutes while the run trains"}]
