"""Benchmark: `doctor`'s whole time (the command, from its start to its report: preflight,
sync, torchrun, the measurements, teardown) on 2, 4 and 8 sandbox nodes, whether it names
anybody on a healthy sandbox (false positives, TRIALS runs per size), and one run per size
with the second node's egress throttled by tc (it must be named, and only it).

One sandbox of the largest size, set up without site.yml (sandbox_bench.bench_sandbox);
the first N nodes are used. Each run's raw measurements (rank 0's result line) are kept
in tests/orchestrator/doctor_results/, where the analysis' unit tests read them.

    python bench/doctor.py [--sizes 2,4,8] [--trials 10] [--throttle 200mbit]

Writes bench/results/doctor.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandbox_bench import ENV, REPO, bench_sandbox, node_exec, sandbox_down  # REPO first

from orchestrator.node import doctor as doctor_job  # noqa: E402
from orchestrator.record.rundir import RunDir  # noqa: E402
from orchestrator.workloads.doctor_run import read_result  # noqa: E402


def doctor(inventory: str, nodes: int, runs: Path) -> tuple[float, dict, dict]:
    """One `doctor --json` run: its seconds, its report and the job's raw result."""
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "orchestrator", "doctor", "-i", inventory,
                        "--nodes", str(nodes), "--json", "--runs-dir", str(runs)],
                       env=ENV, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - start
    if p.returncode not in (0, 1) or not p.stdout.strip():
        raise SystemExit(f"doctor failed ({p.returncode}):\n{p.stderr[-3000:]}")
    report = json.loads(p.stdout)
    raw = read_result(RunDir(runs, report["run_id"]).log("node0"))
    return took, report, raw


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2,4,8")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--throttle", default="200mbit")
    ap.add_argument("--name", default="bench-doctor")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "doctor.json"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    raw_dir = REPO / "tests" / "orchestrator" / "doctor_results"
    raw_dir.mkdir(parents=True, exist_ok=True)
    info = bench_sandbox(args.name, max(sizes), bastion=False)
    runs = Path(tempfile.mkdtemp(prefix="doctor-bench-runs-"))
    results = []
    try:
        for n in sizes:
            row: dict = {"nodes": n, "seconds": [], "suspects": [], "busbw_gbyte_s": []}
            for trial in range(args.trials):
                took, report, raw = doctor(info["inventory"], n, runs)
                row["seconds"].append(round(took, 2))
                row["suspects"].append(report["suspects"])
                row["busbw_gbyte_s"].append(round(report["allreduce"]["busbw_gbyte_s"], 4))
                (raw_dir / f"healthy-{n}nodes-{trial}.json").write_text(json.dumps(raw) + "\n")
                print(f"{n} nodes, trial {trial}: {took:.1f} s, suspects "
                      f"{[s['node'] for s in report['suspects']]}", flush=True)
            slow = info["nodes"][1]
            node_exec(slow["container"], f"tc qdisc add dev eth0 root tbf rate {args.throttle} "
                                         "burst 64kb latency 200ms")
            try:
                took, report, raw = doctor(info["inventory"], n, runs)
            finally:
                node_exec(slow["container"], "tc qdisc del dev eth0 root")
            (raw_dir / f"throttled-{slow['name']}-{n}nodes.json").write_text(
                json.dumps(raw) + "\n")
            row["throttled"] = {"node": slow["name"], "rate": args.throttle,
                                "seconds": round(took, 2),
                                "suspects": report["suspects"],
                                "its_links_gbit_s": [round(lk["gbit_s"], 3)
                                                     for lk in report["links"]
                                                     if lk["src"] == slow["name"]]}
            print(f"{n} nodes, {slow['name']} throttled: suspects "
                  f"{[s['node'] for s in report['suspects']]}", flush=True)
            results.append(row)
    finally:
        sandbox_down(args.name)
    Path(args.out).write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": "the 2-core x86_64 build machine; sandbox nodes are containers on it",
        "command": f"python -m orchestrator doctor --nodes N --json (defaults: link "
                   f"{doctor_job.LINK_SECONDS:g} s per "
                   "direction)",
        "results": results}, indent=2) + "\n")
    print("| nodes | doctor, median (min-max) | healthy runs with a suspect | throttled node "
          "named alone |")
    print("|---:|---:|---:|:---|")
    for r in results:
        wrong = sum(1 for s in r["suspects"] if s)
        alone = [s["node"] for s in r["throttled"]["suspects"]] == [r["throttled"]["node"]]
        print(f"| {r['nodes']} | {statistics.median(r['seconds']):.1f} s "
              f"({min(r['seconds']):.1f}-{max(r['seconds']):.1f}) | {wrong} of "
              f"{len(r['suspects'])} | {'yes' if alone else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
