"""Benchmark: a run's report.html at scale: its size, the time to draw it, and the size of
the timeline it is drawn from, for runs of 16 and 64 nodes over 10 and 24 hours (one rank
a node, a beat every 3 s, one node 1.5 x slower: the straggler the charts mark).

The records are made by the project's own code, as a run leaves them: `Progress` fed the
beat lines, its points appended to timeline.jsonl, the summary written (which draws the
report). No cluster is needed.

    python bench/report.py [--sizes 16x10,64x10,64x24] [--trials 3]

Writes bench/results/report.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.record.progress import Progress  # noqa: E402
from orchestrator.record.rundir import RunDir, iso  # noqa: E402
from orchestrator.report.page import write_report  # noqa: E402

START = 1_790_000_000.0
EVERY = 3   # seconds between a rank's beats


def record(root: Path, nodes: int, hours: float) -> tuple[RunDir, float]:
    """A finished run of NODES nodes over HOURS; the seconds its beats took to feed."""
    names = [f"node{i}" for i in range(nodes)]
    seconds = int(hours * 3600)
    rng = random.Random(1)
    run = RunDir(root, f"bench-{nodes}x{hours:g}h")
    run.create({"run_id": run.run_id, "nodes": names, "script": "train.py",
                "users": {n: "bench" for n in names}})
    fed = time.perf_counter()
    progress = Progress(now=0.0, wall=START)
    for second in range(0, seconds, EVERY):
        loss = 2.3 * (1 - 0.8 * second / seconds)
        for rank, node in enumerate(names):
            step_s = 0.1 * (1 + rng.uniform(-0.03, 0.03)) * (1.5 if rank == 3 else 1.0)
            progress.line(node, rank, f"##clustertrain beat step_s={step_s:.6f} samples=32 "
                          f"loss={loss:.4f}", now=float(second))
        if second % 60 == 0:
            progress.stragglers(now=float(second))
            run.append_timeline(progress.take_points())
    summary = progress.to_json()
    run.append_timeline(progress.take_points())
    fed = time.perf_counter() - fed
    for node in names:
        run.log(node).write_text("".join(f"{node}/rank0 | step {i}\n" for i in range(200)))
    run.summary_json.write_text(json.dumps({
        **run.info(), "status": "succeeded", "start": iso(START), "end": iso(START + seconds),
        "duration_s": float(seconds), "first_failed": None,
        "nodes": [{"name": n, "node_rank": i, "nproc": 1, "exit_code": 0,
                   "end_reason": "exited"} for i, n in enumerate(names)],
        "step_times": summary["nodes"], "stragglers": summary["stragglers"]}))
    return run, fed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="16x10,64x10,64x24",
                    help="NODESxHOURS, comma-separated")
    ap.add_argument("--trials", type=int, default=3, help="draws of each report (median)")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            nodes, hours = size.split("x")
            run, fed = record(Path(tmp), int(nodes), float(hours))
            draws = []
            for _ in range(args.trials):
                start = time.perf_counter()
                write_report(run)
                draws.append(time.perf_counter() - start)
            rows.append({"nodes": int(nodes), "hours": float(hours),
                         "timeline_bytes": run.timeline.stat().st_size,
                         "report_bytes": run.report_html.stat().st_size,
                         "draw_s": round(statistics.median(draws), 3),
                         "draws_s": [round(d, 3) for d in draws],
                         "feed_s": round(fed, 2), "stragglers": [
                             s["node"] for s in json.loads(run.summary_json.read_text())
                             ["stragglers"]]})
            print(f"{size}: {rows[-1]}", file=sys.stderr, flush=True)
    out = REPO / "bench" / "results" / "report.json"
    out.write_text(json.dumps({
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {platform.python_implementation()} "
                   f"{platform.python_version()}", "beat_every_s": EVERY, "rows": rows},
        indent=2) + "\n")
    print("| nodes | hours | timeline.jsonl | report.html | draw (median) | straggler marked |")
    print("|------:|------:|---------------:|------------:|--------------:|------------------|")
    for r in rows:
        print(f"| {r['nodes']} | {r['hours']:g} | {r['timeline_bytes'] / 1e6:.1f} MB | "
              f"{r['report_bytes'] / 1e6:.2f} MB | {r['draw_s']:.2f} s | "
              f"{', '.join(r['stragglers']) or 'none'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
