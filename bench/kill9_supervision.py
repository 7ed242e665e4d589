"""kill -9 of an attached `train`: seconds until no process of the run is left on any
node, over N trials (the nodes' supervisors stop the job when the controller's lease
ends). On a sandbox of 3 nodes behind a bastion set up for `train` without site.yml
(sandbox_bench.bench_sandbox), removed afterwards, or on --sandbox NAME:

    python bench/kill9_supervision.py [--sandbox NAME] [--trials 20] [--nodes 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandbox_bench import ENV, REPO, bench_sandbox, sandbox_down, sh  # puts REPO on sys.path

JOBS = REPO / "tests" / "orchestrator" / "jobs"
RANK_OK = re.compile(r"\| rank \d+/\d+ host \S+ sum \d+ ok$", re.M)


def run_processes(containers: list[str], user: str, run_id: str) -> int:
    """Processes carrying the run's id in their environment, over all nodes."""
    count = 0
    for c in containers:
        out = subprocess.run(["podman", "exec", c, "runuser", "-u", user, "--", "sh", "-c",
                              f"grep -l -a -x -z CLUSTERTRAIN_RUN_ID={run_id} "
                              "/proc/[0-9]*/environ 2>/dev/null | wc -l"],
                             env=ENV, capture_output=True, text=True).stdout.strip()
        count += int(out or 0)
    return count


def trial(inventory: str, nodes: int, containers: list[str], user: str) -> float:
    runs = Path(tempfile.mkdtemp(prefix="kill9-"))
    out = open(runs / "train.out", "w")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "train", "-i", inventory,
                             "--runs-dir", str(runs), "--workdir", str(JOBS), "--nodes",
                             str(nodes), "ddp_allreduce.py", "--", "--steps", "1", "--sleep",
                             "600"], cwd=REPO, env=ENV, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    # Every rank has printed its result ("rank R/W host H sum S ok"): the job runs.
    while len(RANK_OK.findall((runs / "train.out").read_text())) < nodes:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the job did not start:\n{(runs / 'train.out').read_text()[-2000:]}")
        time.sleep(0.2)
    (run_id,) = [d.name for d in runs.iterdir() if d.is_dir()]
    if not run_processes(containers, user, run_id):  # nothing to measure: say so
        raise SystemExit(f"run {run_id}: no process of the run found on the nodes")
    proc.kill()
    killed = time.monotonic()
    while run_processes(containers, user, run_id):
        if time.monotonic() - killed > 120:
            raise SystemExit(f"run {run_id}: processes left 120 s after kill -9")
        time.sleep(0.2)
    return time.monotonic() - killed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sandbox", help="reuse this sandbox (set up by site.yml or by "
                    "bench_sandbox)")
    ap.add_argument("--name", default=f"kill9-bench-{os.getpid()}")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "kill9_supervision.json"))
    args = ap.parse_args()
    if not args.sandbox:
        bench_sandbox(args.name, args.nodes, bastion=True)
    try:
        info = json.loads(sh(sys.executable, "-m", "orchestrator", "sandbox", "status",
                             "--name", args.sandbox or args.name, "--json").stdout)
        containers = [n["container"] for n in info["nodes"] if not n["outsider"]][:args.nodes]
        times = []
        for i in range(args.trials):
            times.append(round(trial(info["inventory"], args.nodes, containers, "alice"), 2))
            print(f"trial {i + 1}: nothing left after {times[-1]:.2f} s", flush=True)
    finally:
        if not args.sandbox:
            sandbox_down(args.name)
    result = {
        "what": "seconds from kill -9 of an attached `train` until no process of the run "
                "is left on any node (polled every 0.2 s, podman exec per node)",
        "machine": f"{os.cpu_count()} cores, sandbox containers ({args.nodes} nodes, bastion "
                   f"{'yes' if info.get('bastion') else 'no'})",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "trials": len(times), "median_s": statistics.median(times), "min_s": min(times),
        "max_s": max(times), "all_s": times,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "all_s"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
