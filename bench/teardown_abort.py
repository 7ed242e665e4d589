"""Benchmark: how often torch's teardown fails a finished run, without and with the worker
runner (orchestrator/run_worker.py).

A correct gloo DDP script that ends as users' scripts do (barrier, destroy_process_group(),
return; no os._exit: tests/orchestrator/jobs/ddp_allreduce.py) runs with the whole
`python -m orchestrator train --nodes 3` command line, RUNS times with --no-clean-exit
(torchrun runs the script itself: "before") and RUNS times through the runner ("after"),
interleaved so that both see the same load. A run counts as a teardown abort when every
rank printed its correct result and the run still failed with a SIGABRT in a node's log
("terminate called without an active exception"); the rate counts the runs that reached
their result (other failures, e.g. a node's environment being changed, are listed apart).

    python bench/teardown_abort.py [--runs 50] [--sandbox NAME] [--resume]

--sandbox reuses a provisioned sandbox (as CLUSTERTRAIN_TEST_SANDBOX does for the tests);
without it, a 3-node sandbox behind a bastion is made with torch on its share (as
bench/launch_fanout.py does) and removed afterwards. Results go to
bench/results/teardown_abort.json after every run (--resume adds to them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandbox_bench import ENV, REPO, bench_sandbox, sandbox_down  # puts REPO on sys.path

JOBS = REPO / "tests" / "orchestrator" / "jobs"
NODES = 3
MODES = {"before": ["--no-clean-exit"], "after": []}
ABORT_SIGNS = ("SIGABRT", "terminate called without an active exception")


def inventory_of(sandbox: str) -> str:
    st = subprocess.run([sys.executable, "-m", "orchestrator", "sandbox", "status", "--name",
                         sandbox, "--json"], env=ENV, cwd=REPO, capture_output=True,
                        text=True, check=True)
    return json.loads(st.stdout)["inventory"]


def one_run(inventory: str, mode: str, runs_dir: Path, sandbox: str) -> dict:
    started = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "orchestrator", "train", "-i", inventory,
                            "--nodes", str(NODES), "--workdir", str(JOBS), "--runs-dir",
                            str(runs_dir), *MODES[mode], "ddp_allreduce.py", "--", "--steps",
                            "1"], env=ENV, cwd=REPO, capture_output=True, text=True,
                           timeout=600)
    except subprocess.TimeoutExpired as exc:  # recorded as a failure of its own kind
        p = subprocess.CompletedProcess(exc.cmd, -1, "", f"timed out after 600 s; "
                                        f"{(exc.stderr or b'')[-1000:]!r}")
    found: list[Path | None] = [d for d in runs_dir.iterdir() if d.is_dir()]
    [run] = found or [None]
    summary = json.loads((run / "summary.json").read_text()) if run and (
        run / "summary.json").exists() else {}
    logs = "".join(p.read_text(errors="replace") for p in run.glob("*.log")) if run else ""
    results_ok = all(f"rank {r}/{NODES} host node{r} sum 6 ok" in logs for r in range(NODES))
    aborted = any(sign in logs for sign in ABORT_SIGNS)
    return {"mode": mode, "exit": p.returncode, "status": summary.get("status"),
            "training_completed": summary.get("training_completed"),
            "after_finish": summary.get("after_finish"), "results_ok": results_ok,
            "teardown_abort": p.returncode != 0 and results_ok and aborted,
            "sigabrt_in_logs": aborted, "seconds": round(time.monotonic() - started, 1),
            "run_id": run.name if run else None, "sandbox": sandbox,
            **({"stderr_tail": p.stderr[-1500:]} if p.returncode != 0 else {})}


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson score interval of a rate k/n."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def tally(samples: list[dict]) -> dict:
    out = {}
    for mode in MODES:
        s = [x for x in samples if x["mode"] == mode]
        aborts = sum(x["teardown_abort"] for x in s)
        # A run that failed before every rank had its result (e.g. a node's environment
        # changed under it) could not show a teardown abort: not counted in the rate.
        other = sum(x["exit"] != 0 and not x["teardown_abort"] for x in s)
        counted = len(s) - other
        out[mode] = {"runs": len(s), "succeeded": sum(x["exit"] == 0 for x in s),
                     "failed": sum(x["exit"] != 0 for x in s), "teardown_aborts": aborts,
                     "other_failures": other, "runs_counted": counted,
                     "abort_rate": round(aborts / counted, 4) if counted else None,
                     "abort_rate_95ci": wilson(aborts, counted),
                     "sigabrt_in_logs_of_succeeded_runs": sum(
                         x["exit"] == 0 and x["sigabrt_in_logs"] for x in s)}
    return out


def save(out: Path, samples: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "what": f"runs of a correct gloo DDP script (destroy_process_group(), no os._exit) "
                f"with `train --nodes {NODES}`, 1 process per node; before: "
                "--no-clean-exit, after: the worker runner; a teardown abort is a failed run "
                "whose ranks all printed their correct result, with SIGABRT in a node's log",
        "torch": "2.13.0+cpu, gloo",
        "machine": f"{os.cpu_count()} cores, shared with other work; sandbox containers "
                   "behind a bastion",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "summary": tally(samples), "samples": samples}, indent=2) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50, help="runs per mode (default 50)")
    ap.add_argument("--sandbox", help="reuse this provisioned sandbox")
    ap.add_argument("--name", default=f"abort-bench-{os.getpid()}")
    ap.add_argument("--resume", action="store_true", help="add to the results file")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "teardown_abort.json"))
    args = ap.parse_args()
    out = Path(args.out)
    samples = json.loads(out.read_text())["samples"] if args.resume and out.exists() else []
    if args.sandbox:
        inventory = inventory_of(args.sandbox)
    else:
        inventory = bench_sandbox(args.name, NODES, bastion=True)["inventory"]
    sandbox = args.sandbox or f"{args.name} (made by this benchmark, not provisioned)"
    try:
        with tempfile.TemporaryDirectory(prefix="abort-bench-") as tmp:
            for i in range(args.runs):
                for mode in MODES:
                    sample = one_run(inventory, mode, Path(tmp) / f"{mode}-{i}", sandbox)
                    samples.append(sample)
                    print(json.dumps({k: sample[k] for k in ("mode", "exit", "status",
                                      "teardown_abort", "seconds")}), flush=True)
                    save(out, samples)
    finally:
        if not args.sandbox:
            sandbox_down(args.name)
    save(out, samples)
    summary = tally(samples)
    print("\n| mode | runs counted | teardown aborts | rate (95% CI) | other failures |\n"
          "|---|---|---|---|---|")
    for mode, s in summary.items():
        print(f"| {mode} | {s['runs_counted']} | {s['teardown_aborts']} | "
              f"{s['abort_rate'] or 0:.0%} ({s['abort_rate_95ci'][0]:.0%}-"
              f"{s['abort_rate_95ci'][1]:.0%}) | {s['other_failures']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
