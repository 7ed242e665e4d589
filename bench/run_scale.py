"""Benchmark: a run's life at 8, 16, 32 and 64 sandbox nodes: launched, supervised and
stopped on every node, the curve of each time against the number of nodes.

One sandbox of the largest size, set up for `train` without site.yml
(sandbox_bench.bench_sandbox: torch installed once on the share, every node's
python_env.json pointing at it). These nodes are lighter than the test cluster's: no
firewall, no NFS client (the share is the sandbox's own bind mount through each node's FUSE
layer), no provisioned environment of their own. The first N nodes are used, one rank
each. Per size:

  launch    over open connections, both launch phases, until torchrun runs on every node
            (launch_fanout.bench_launch: the same measure as there)
  failure   `train` with a job whose last rank exits 1 once every rank runs: from that
            exit (the rank's own time stamp) until every node's supervisor has ended (the
            `ended` of each node's state file on the share)
  ctrl_c    `train` with a job whose ranks sleep, SIGINT to `train` once every rank runs:
            until every node's supervisor has ended, and until `train` has exited; then no
            process of the run is left on any node (counted by the run id in each process's
            environment, as bench/kill9_supervision.py does)

Sandbox nodes share the controller's kernel clock, so node and controller times compare
exactly. Every size shares the machine's two cores with all of its nodes: each torchrun
imports torch, which is most of a launch here; on real servers each node has its own.
64 containers need more inotify instances than the default 128 (the sandbox says so and
how to raise it).

    python bench/run_scale.py [--sizes 8,16,32,64] [--repeats 1]

Writes bench/results/run_scale.json (after every size) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kill9_supervision import run_processes
from launch_fanout import TRIVIAL, bench_launch
from sandbox_bench import ENV, REPO, USER, bench_sandbox, sandbox_down, write_results

from orchestrator.cluster.inventory import load_cluster  # noqa: E402
from orchestrator.record.rundir import run_state_dir  # noqa: E402

JOB = """\
import os, sys, time
mode, n, marks = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rank = int(os.environ["RANK"])
open(os.path.join(marks, f"started-{rank}"), "w").close()
if mode == "fail" and rank == n - 1:
    while sum(f.startswith("started-") for f in os.listdir(marks)) < n:
        time.sleep(0.05)
    time.sleep(1.0)   # every rank runs
    with open(os.path.join(marks, "failed"), "w") as fh:
        fh.write(repr(time.time()))
    sys.exit(1)
time.sleep(600)
"""
MARKS = "checkpoints/bench-scale"   # on the share (world-writable there), per trial below


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


class Trial:
    """One `train` of JOB in MODE on the first N nodes."""

    def __init__(self, info: dict, work: Path, n: int, mode: str) -> None:
        self.share, self.n = Path(info["share"]), n
        self.containers = [x["container"] for x in info["nodes"][:n]]
        self.names = [x["name"] for x in info["nodes"][:n]]
        tag = f"{mode}-{n}-{time.time_ns()}"
        self.marks = self.share / MARKS / tag
        self.marks.mkdir(parents=True)
        self.marks.chmod(0o777)
        self.runs = Path(tempfile.mkdtemp(prefix="run-scale-", dir=work))
        self.log = self.runs / "train.out"
        node_marks = f"{info['share_mount']}/{MARKS}/{tag}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "train", "-i", info["inventory"],
             "--nodes", str(n), "--workdir", str(work / "code"), "--runs-dir",
             str(self.runs), "scale_job.py", mode, str(n), node_marks],
            cwd=REPO, env=ENV, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        self.peak_mem: float | None = None

    def wait_running(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while len(list(self.marks.glob("started-*"))) < self.n:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.n} nodes: the job did not start on every node:\n"
                                   + self.log.read_text()[-2000:])
            time.sleep(0.1)
        self.peak_mem = mem_available_gib()

    @property
    def run_id(self) -> str:
        (run_id,) = [d.name for d in self.runs.iterdir() if d.is_dir()]
        return run_id

    def ended(self, timeout: float = 30) -> list[float]:
        """Every node's supervisor's end (the `ended` of its state file on the share)."""
        states = self.share / Path(run_state_dir("/", USER, self.run_id)).relative_to("/")
        deadline = time.monotonic() + timeout
        while True:
            ends = [json.loads(f.read_text()).get("ended") if f.exists() else None
                    for f in (states / f"{name}.json" for name in self.names)]
            if all(isinstance(e, (int, float)) for e in ends):
                return [float(e) for e in ends if e is not None]
            if time.monotonic() > deadline:
                late = [n for n, e in zip(self.names, ends, strict=True) if e is None]
                raise RuntimeError(f"{self.n} nodes: state files not ended: {late}")
            time.sleep(0.5)   # the last state files are being written

    def left(self) -> int:
        return run_processes(self.containers, USER, self.run_id)


def failure(info: dict, work: Path, n: int) -> dict:
    t = Trial(info, work, n, "fail")
    t.wait_running()
    code = t.proc.wait(timeout=300)
    failed_at = float((t.marks / "failed").read_text())
    ends = t.ended()
    return {"all_stopped_s": round(max(ends) - failed_at, 3), "train_exit": code,
            "left": t.left(), "mem_available_gib": round(t.peak_mem or 0, 1)}


def ctrl_c(info: dict, work: Path, n: int) -> dict:
    t = Trial(info, work, n, "sleep")
    t.wait_running()
    pressed = time.time()
    t.proc.send_signal(signal.SIGINT)
    code = t.proc.wait(timeout=300)
    exited = time.time()
    ends = t.ended()
    return {"all_ended_s": round(max(ends) - pressed, 3),
            "train_exited_s": round(exited - pressed, 3), "train_exit": code,
            "left": t.left(), "mem_available_gib": round(t.peak_mem or 0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,16,32,64")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--name", default=f"scale-bench-{os.getpid()}")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "run_scale.json"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(f"/tmp/{args.name}")
    (work / "code").mkdir(parents=True, exist_ok=True)
    (work / "code" / "trivial.py").write_text(TRIVIAL)
    (work / "code" / "scale_job.py").write_text(JOB)
    t0 = time.time()
    info = bench_sandbox(args.name, max(sizes), bastion=False)
    cluster_all = load_cluster(info["inventory"])
    info["share_mount"] = cluster_all.shared_path.rstrip("/")
    up_s = round(time.time() - t0, 1)
    results: list[dict] = []
    failed = None

    def save() -> None:
        write_results(args.out, "a run's life on the first N nodes of one sandbox: launch "
                      "over open connections until torchrun runs everywhere; from the "
                      "failing rank's exit until every node's supervisor ended; from Ctrl-C "
                      "until every supervisor ended and until train exited; processes "
                      "left after each; MemAvailable with every rank running",
                      f"sandbox nodes set up without site.yml (torch on the share), one "
                      f"rank each; {max(sizes)}-node sandbox up and set up in {up_s} s",
                      results, **({"failed": failed} if failed else {}))

    try:
        for n in sizes:
            cluster = cluster_all.select(nodes=n)
            containers = [x["container"] for x in info["nodes"][:n]]
            row: dict = {"nodes": n, "load_before": round(os.getloadavg()[0], 1)}
            launches = [bench_launch(cluster, containers, work / "code", work / "runs")
                        for _ in range(args.repeats)]
            row["launch_connected_s"] = [round(c, 3) for _, c, _ in launches]
            row["launch_go_s"] = [round(g, 3) for _, _, g in launches]
            row["failure"] = [failure(info, work, n) for _ in range(args.repeats)]
            row["ctrl_c"] = [ctrl_c(info, work, n) for _ in range(args.repeats)]
            row["load_after"] = round(os.getloadavg()[0], 1)
            results.append(row)
            print(json.dumps(row), flush=True)
            save()
    except Exception as exc:  # noqa: BLE001 - the sizes measured so far are kept, with why
        failed = f"{type(exc).__name__}: {str(exc)[:1500]}"
        print(failed, file=sys.stderr)
    finally:
        sandbox_down(args.name)
        save()
    print("\n| nodes | launch, connected (s) | from GO (s) | failure -> all stopped (s) | "
          "Ctrl-C -> all ended (s) | Ctrl-C -> train exited (s) | left |\n"
          "|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['nodes']} | {max(r['launch_connected_s']):.2f} | "
              f"{max(r['launch_go_s']):.2f} | "
              f"{max(f['all_stopped_s'] for f in r['failure']):.2f} | "
              f"{max(c['all_ended_s'] for c in r['ctrl_c']):.2f} | "
              f"{max(c['train_exited_s'] for c in r['ctrl_c']):.2f} | "
              f"{sum(f['left'] for f in r['failure'] + r['ctrl_c'])} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
