"""A run's report.html, looked at in headless Chromium as a reader would: the charts have
a line per node, the straggler and the hang's suspect are marked, the doctor's heatmap has
the named node's row slow; and the file needs no network and stays small.

Screenshots are kept under .cache/test-artifacts/ (CLUSTERTRAIN_TEST_ARTIFACTS)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from orchestrator.node.sysmetrics import Gpu
from orchestrator.record.progress import Point
from orchestrator.record.rundir import RunDir, iso
from orchestrator.record.system import Sample, flags_of
from orchestrator.report import svg
from orchestrator.report.page import context, read_timeline, try_write_report

from .browser import count_color, dom, marked_rows, screenshot, series, suspects
from .recorded import START, write_run

NODES = ["node0", "node1", "node2", "node3"]


def test_the_report_shows_a_line_per_node_with_the_straggler_and_the_hang_suspect_marked(
        tmp_path: Path) -> None:
    run = write_run(tmp_path, "20260921-000000-abcdef", NODES, 900, slow="node2", hang=True)
    shot = screenshot(run.report_html, "report-straggler-hang")
    elements = dom(run.report_html)
    for chart in ("step", "rate"):
        lines = series(elements, chart)
        assert sorted(lines) == NODES
        assert all(len(a["points"].split()) >= 80 for a in lines.values())  # 90 windows
        marked = {n for n, a in lines.items() if "data-mark" in a}
        assert marked == {"node2"}
        assert lines["node2"]["stroke"] == svg.MARK_COLOR
        assert "straggler" in lines["node2"]["data-mark"]
    assert series(elements, "loss")   # the beats said a loss
    # The hang: the recorded job's rank 2 (labelled node1) is named, its group marked.
    assert suspects(elements) == ["node1/2"]
    named = next(e for e in elements if e.attrs.get("data-suspect"))
    assert "stuck_in_data_loading" in named.text
    rows = [e for e in elements if e.tag == "tr" and e.has_class("suspect")]
    assert any("node1/rank2" in r.text for r in rows)
    assert [e.text for e in elements if e.attrs.get("id") == "status"] == ["hung"]
    # What the screenshot shows: the straggler's thick red line (3 px over the plot's
    # width, in two charts) and the hang mark, more red than the text alone has.
    assert count_color(shot, svg.MARK_COLOR, tolerance=10) > 3000


def test_the_doctors_heatmap_has_the_named_nodes_row_slow_and_marked(tmp_path: Path) -> None:
    run = write_run(tmp_path, "20260921-000000-d0c702", NODES, 120,
                    doctor="throttled-node1-4nodes.json")
    shot = screenshot(run.report_html, "report-doctor")
    elements = dom(run.report_html)
    cells = [e.attrs for e in elements if e.tag == "rect" and e.has_class("cell")]
    assert len(cells) == 12   # 4 x 3 links
    by_row = {n: [float(c["data-value"]) for c in cells if c["data-src"] == n] for n in NODES}
    slowest = min(by_row, key=lambda n: max(by_row[n]))
    assert slowest == "node1"
    assert marked_rows(elements) == ["node1"]
    suspect_rows = [e.attrs["data-node"] for e in elements if e.tag == "tr"
                    and e.has_class("suspect") and e.attrs.get("data-node")]
    assert "node1" in suspect_rows
    # The slow row is drawn dark red: three cells of 48 x 48 px.
    assert count_color(shot, svg.heat(0.0, 1.0), tolerance=30) > 3 * 40 * 40


def test_a_16_node_10_hour_report_needs_no_network_and_is_under_2_mb(tmp_path: Path) -> None:
    nodes = [f"node{i}" for i in range(16)]
    run = write_run(tmp_path, "20260921-000000-10h16n", nodes, 36000, slow="node7", every=3,
                    log_lines=200)
    assert len(read_timeline(run)) == 3600    # a point per 10 s window
    size = run.report_html.stat().st_size
    assert size < 2_000_000, f"report.html is {size} bytes"
    html = run.report_html.read_text()
    # Nothing to fetch: no src, no link, no CSS url(), no script; the one URL is the SVG
    # namespace, a name that is never fetched.
    assert not re.search(r"<(script|link|img|iframe)\b", html)
    assert "url(" not in html
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) == {"http://www.w3.org/2000/svg"}
    assert all(not re.match(r"[a-z]+:", h) for h in re.findall(r'href="([^"]*)"', html))
    # Drawn with every request refused, it shows all 16 nodes' lines.
    screenshot(run.report_html, "report-16-nodes-10-hours", height=1600)
    lines = series(dom(run.report_html), "step")
    # In the run's order (node10 after node9), the straggler drawn last, on top.
    assert list(lines) == [n for n in nodes if n != "node7"] + ["node7"]
    assert {n for n, a in lines.items() if "data-mark" in a} == {"node7"}
    assert all(len(a["points"].split()) <= svg.MAX_POINTS for a in lines.values())


def test_a_recovered_runs_report_draws_its_attempts_on_one_time_axis(tmp_path: Path) -> None:
    write_run(tmp_path, "20260921-000000-5e5e5e", ["node0", "node1"], 300)
    recovery = {"attempt": 1, "failed_run": "20260921-000000-5e5e5e", "node": "node1",
                "why": "lost", "failed_at": iso(START + 300),
                "run_id": "20260921-000000-5e5e5e.r1", "nodes": ["node0", "node2"],
                "spare": "node2", "cordoned": True,
                "training_again_at": iso(START + 330), "down_s": 30.0}
    run = write_run(tmp_path, "20260921-000000-5e5e5e.r1", ["node0", "node2"], 300,
                    start=START + 330, summary={"recoveries": [recovery]})
    elements = dom(run.report_html)
    labels = [e.attrs["data-label"] for e in elements if e.tag == "g" and e.has_class("mark")]
    assert set(labels) == {"node1 failed", "training again"}
    lines = series(elements, "step")
    assert set(lines) == {"node0", "node1", "node2"}   # node1 before, node2 after
    xs = {n: [float(p.split(",")[0]) for p in a["points"].split()] for n, a in lines.items()}
    assert max(xs["node1"]) < min(xs["node2"])
    assert len(xs["node0"]) > len(xs["node1"])          # node0 in both attempts
    assert "spare node2" in run.report_html.read_text()
    # node0's line is cut between the attempts: nothing is drawn across the restart.
    pieces = [e for e in elements if e.tag == "polyline" and e.attrs.get("data-node") == "node0"
              and e.has_class("series")]
    assert len(pieces) == 2 * 2   # two charts (step time, samples/s), two pieces each


def test_a_run_is_reported_when_its_summary_is_written_and_again_on_demand(
        tmp_path: Path) -> None:
    run = write_run(tmp_path, "20260921-000000-a9a1a1", NODES[:2], 60)
    first = run.report_html.read_text()
    assert "succeeded" in first and "node1.log" in first
    run.report_html.unlink()
    out = subprocess.run([sys.executable, "-m", "orchestrator", "runs", "report", run.run_id,
                          "--runs-dir", str(tmp_path)], capture_output=True, text=True,
                         check=True)
    assert str(run.report_html) in out.stdout
    assert run.report_html.read_text() == first
    bad = subprocess.run([sys.executable, "-m", "orchestrator", "runs", "report",
                          "--runs-dir", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode != 0 and "name the run" in bad.stderr


def test_a_report_is_drawn_from_a_timeline_cut_short(tmp_path: Path) -> None:
    run = RunDir(tmp_path, "20260921-000000-c0ffee")
    run.create({"run_id": run.run_id, "nodes": ["node0"], "script": "job.py"})
    point = Point(1_790_000_000.0, {}, 0.5)
    run.timeline.write_text(json.dumps(point.to_json()) + "\n" + '{"t": 1790000010, "no')
    assert read_timeline(run) == [point]
    html = run.report_html if try_write_report(run) else None
    assert html is not None and "running" in html.read_text()


def test_the_system_section_draws_every_nodes_metrics_and_lists_the_flags(
        tmp_path: Path) -> None:
    """From the timeline's system samples: a chart per metric with a line per node (per
    GPU), the idle GPU's line marked, and the flags listed; a live run's flags come from
    its samples by the same rule."""
    names = ["node0", "node1"]
    gib = 1 << 30
    samples = [Sample(n, START + t, 20.0 + i, 64 * gib, (40 - i) * gib, 3 * gib, 1e6 * (i + 1),
                      5e5, (Gpu(0, 0.0, gib, 80 * gib),
                            Gpu(1, 90.0, 2 * gib, 80 * gib)))
               for t in range(0, 200, 10) for i, n in enumerate(names)]
    idle = [f.to_json() for f in flags_of(samples)]
    assert [(f["node"], f["gpu"]) for f in idle] == [("node0", 0), ("node1", 0)]
    run = write_run(tmp_path, "20260921-000000-5y5731", names, 200,
                    summary={"system_flags": idle})
    run.append_timeline(samples)
    assert len(read_timeline(run)) == 20 and run.read_timeline(Sample.from_json) == samples
    try_write_report(run)
    elements = dom(run.report_html)
    for chart in ("cpu", "memory", "rss", "net-in", "net-out"):
        assert sorted(series(elements, chart)) == names, chart
    gpus = series(elements, "gpu-util")
    assert sorted(gpus) == ["node0 GPU 0", "node0 GPU 1", "node1 GPU 0", "node1 GPU 1"]
    assert {g for g, a in gpus.items() if a.get("data-mark") == "idle"} == \
        {"node0 GPU 0", "node1 GPU 0"}
    assert sorted(series(elements, "gpu-memory")) == sorted(gpus)
    said = [e for e in elements if e.attrs.get("data-flag") == "gpu-idle"]
    assert [e.attrs["data-node"] for e in said] == names
    assert "node0 GPU 0 idle (0 % used) for 3 minutes" in said[0].text
    assert series(elements, "step")   # the progress charts are still there
    run.summary_json.unlink()          # live: no summary yet
    assert context(run)["system_flags"] == idle


def test_a_run_without_samples_says_so_and_draws_no_system_chart(tmp_path: Path) -> None:
    run = write_run(tmp_path, "20260921-000000-n05y5", ["node0"], 60)
    page = context(run)
    assert page["system"] == [] and page["system_flags"] == []
    assert "No system samples yet" in run.report_html.read_text()
