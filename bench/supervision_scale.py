"""The supervisors' ring (orchestrator/node/ring.py) at 8, 16, 32 and 64 nodes: N real
supervisor processes (`node.py supervise`) on this machine, talking UDP over the loopback,
a temporary directory standing in for the share; each one's "job" is a `sleep` (no
torchrun: this measures the supervision, not a launch). Per size and trial:

- a job fails (exits 1) on one node: seconds until every other node has stopped its job,
  by the nodes' own end times;
- what the supervision cost per node per second while all ran: datagrams sent and
  received, share reads and writes (each supervisor counts its own: its end's
  "supervision").

Not measured here: a launch over SSH and Ctrl-C across containers (bench/launch_fanout.py
and bench/kill9_supervision.py do that on the sandbox, at fewer nodes).

    python bench/supervision_scale.py [--sizes 8,16,32,64] [--trials 3] [--run-s 12]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "supervision_scale.json"
NODE = [sys.executable, "-m", "orchestrator.node"]


def trial(n: int, run_s: float, work: Path) -> dict:
    names = [f"n{i}" for i in range(n)]
    failing = names[n // 2]
    state = work / "shared"
    key = work / "ring.key"   # the run's ring key, as the launch's GO would bring it
    key.write_text(os.urandom(32).hex())
    procs = []
    for name in names:
        job = work / name / "job"
        job.mkdir(parents=True)
        argv = (["sh", "-c", f"sleep {run_s}; exit 1"] if name == failing
                else ["sleep", str(run_s * 10)])
        procs.append(subprocess.Popen(
            [*NODE, "supervise", "--job", str(job), "--state-dir", str(state), "--run", "b1",
             "--node", name, "--nodes", ",".join(names), "--key-file", str(key),
             "--addresses", ",".join("127.0.0.1" for _ in names), "--grace", "1", "--",
             *argv], cwd=REPO, env={**os.environ, "CLUSTERTRAIN_RUN_ID": "b1"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    for p in procs:
        p.wait(timeout=run_s + 120)
    ends = {name: json.loads((work / name / "job" / "exit").read_text()) for name in names}
    failed_at = ends[failing]["ended"]
    others = [e for name, e in ends.items() if name != failing]
    assert all(e["reason"] == "peer-failed" and e["why"] == failing for e in others), others
    costs = [e["supervision"] for e in ends.values()]

    def rate(key: str) -> float:
        return round(max(c[key] / c["seconds"] for c in costs), 3)

    return {"failure_to_all_stopped_s": round(max(e["ended"] for e in others) - failed_at, 3),
            "sent_per_node_s": rate("sent"), "received_per_node_s": rate("received"),
            "share_reads_per_node_s": rate("share_reads"),
            "share_writes_per_node_s": rate("share_writes")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,16,32,64")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--run-s", type=float, default=12.0)
    args = parser.parse_args()
    results: dict[str, dict] = {}
    for n in (int(s) for s in args.sizes.split(",")):
        trials = []
        for t in range(args.trials):
            with tempfile.TemporaryDirectory(prefix=f"ring{n}-") as tmp:
                trials.append(trial(n, args.run_s, Path(tmp)))
            print(f"{n} nodes, trial {t + 1}: {trials[-1]}", flush=True)
        results[str(n)] = {
            "trials": trials,
            "median": {k: statistics.median(tr[k] for tr in trials) for k in trials[0]}}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} cores, this host (loopback UDP, tmp dir as the share)",
        "run_s": args.run_s, "results": results}, indent=2) + "\n")
    print(f"results: {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
