"""Benchmark: the whole `train` overhead, from the command's start until every rank runs,
with the code unchanged since the last sync; beside the launch alone, `preflight` alone and
`ansible -m ping` on the same nodes.

For 2, 4, 8 and 16 sandbox nodes (one sandbox of the largest size; the first N nodes are used)
a trivial script is started with `python -m orchestrator train`, after a warm-up run (torch
checked once per node, code synced once). Times come from three clocks that are one clock
here (sandbox nodes share the controller's kernel clock):

  the controller's reading of train's stdout: the "syncing" line (preflight done: python
      start, inventory, SSH, probe) and the "starting torchrun" line (sync done)
  a torchrun wrapper on every node that writes the time before it execs torchrun
      (torchrun started: what bench/launch_fanout.py calls the launch)
  the script on every rank, which writes the time when it runs (every rank runs)

so the overhead splits into preflight, sync, launch and torchrun's own start. `preflight`
and `ansible train_nodes -m ping` (forks = N) are timed as commands, wall clock; preflight
also in this (warm) process: reading the inventory, and run_preflight alone (SSH
connections, both rounds).

The sandbox is set up without site.yml (sandbox_bench.bench_sandbox: torch in a venv on
the share, as bench/launch_fanout.py does), with the torchrun wrapper as python_env.json's
torchrun.

    python bench/train_overhead.py [--sizes 2,4,8,16] [--repeats 3] [--bastion]

Writes bench/results/train_overhead.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from sandbox_bench import (  # REPO first
    ENV,
    REPO,
    VENV,
    bench_sandbox,
    node_exec,
    sandbox_down,
    sh,
    write_results,
)

from orchestrator.checks.preflight import run_preflight  # noqa: E402
from orchestrator.cluster.inventory import load_cluster  # noqa: E402

TORCHRUN = "/mnt/cluster/bench-torchrun"   # records the time, then execs the real torchrun
STAMPS = "/tmp/ct-bench"                   # on each node
TRIVIAL = f"""import os, time
run = os.path.basename(os.getcwd())
with open("{STAMPS}-rank.log", "a") as fh:
    fh.write("%.6f %s %s\\n" % (time.time(), run, os.environ.get("RANK")))
"""
WRAPPER = f"""#!/bin/sh
echo "$(date +%s.%N) $*" >> {STAMPS}-torchrun.log
exec {VENV}/bin/torchrun "$@"
"""


def stamps(containers: list[str], log: str, run_id: str) -> list[float]:
    """Per node, the earliest time stamp of RUN_ID in LOG."""
    found = []
    for c in containers:
        lines = [line.split() for line in node_exec(c, f"cat {STAMPS}-{log}.log 2>/dev/null "
                                                       "|| true").splitlines()]
        times = [float(p[0]) for p in lines if p and run_id in " ".join(p[1:])]
        found.append(min(times) if times else float("nan"))
    return found


def train_once(inventory: str, n: int, containers: list[str], workdir: Path,
               runs: Path) -> dict:
    """One `train`: the times of its phases, seconds from the command's start."""
    seen: dict[str, float] = {}
    err = tempfile.TemporaryFile("w+")
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "train", "-i", inventory,
                             "--nodes", str(n), "--workdir", str(workdir), "--runs-dir",
                             str(runs), "trivial.py"], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=err, text=True)

    def read() -> None:
        assert proc.stdout is not None  # stdout=PIPE
        for line in proc.stdout:
            for key, needle in (("preflight", "syncing"), ("sync", "starting torchrun")):
                if needle in line and key not in seen:
                    seen[key] = time.time()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc.wait(timeout=600)
    reader.join(timeout=10)
    if proc.returncode != 0 or len(seen) < 2:
        err.seek(0)
        raise SystemExit(f"train on {n} nodes failed ({seen}):\n{err.read()[-3000:]}")
    run_id = sorted(p.name for p in runs.iterdir())[-1]
    torchrun = max(stamps(containers, "torchrun", run_id))
    ranks = max(stamps(containers, "rank", run_id))
    return {"preflight": seen["preflight"] - t0, "sync": seen["sync"] - seen["preflight"],
            "launch": torchrun - seen["sync"], "torchrun_start": ranks - torchrun,
            "until_torchrun": torchrun - t0, "until_ranks": ranks - t0}


def timed(*argv: str) -> float:
    t0 = time.time()
    sh(*argv)
    return time.time() - t0


def median_of(samples: list[dict]) -> dict:
    return {k: {"median_s": round(statistics.median(s[k] for s in samples), 3),
                "all_s": [round(s[k], 3) for s in samples]} for k in samples[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2,4,8,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default=f"ovh-bench-{os.getpid()}")
    ap.add_argument("--bastion", action="store_true",
                    help="nodes reachable only through a bastion (ProxyJump)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "train_overhead.json"))
    args = ap.parse_args()
    # Bytecode kept, as on a user's machine and under make (the Makefile unexports it): this
    # machine's PYTHONDONTWRITEBYTECODE would have every command compile its modules anew,
    # the tool's and Ansible's alike.
    ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(f"/tmp/{args.name}")
    (work / "code").mkdir(parents=True, exist_ok=True)
    (work / "code" / "trivial.py").write_text(TRIVIAL)
    info = bench_sandbox(args.name, max(sizes), args.bastion, torchrun=TORCHRUN)
    wrapper = Path(info["share"]) / Path(TORCHRUN).name
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    inventory = info["inventory"]
    ansible = str(Path(sys.executable).parent / "ansible")
    results = []
    try:
        for n in sizes:
            containers = [x["container"] for x in info["nodes"][:n]]
            # Warm-up: torch checked once per node (then cached), code synced once.
            sh(sys.executable, "-m", "orchestrator", "preflight", "-i", inventory,
               "--nodes", str(n))
            train_once(inventory, n, containers, work / "code", work / f"runs-{n}")
            rows = []
            for _ in range(args.repeats):
                sample = train_once(inventory, n, containers, work / "code",
                                    work / f"runs-{n}")
                sample["preflight_cli"] = timed(sys.executable, "-m", "orchestrator",
                                                "preflight", "-i", inventory,
                                                "--nodes", str(n))
                t = time.time()
                cluster = load_cluster(inventory).select(nodes=n)
                sample["inventory_load"] = time.time() - t
                t = time.time()
                report = run_preflight(cluster)
                sample["preflight_inprocess"] = time.time() - t
                if report.problems:
                    raise SystemExit(f"preflight on {n} nodes: {report.problems}")
                sample["ansible_ping"] = timed(ansible, f"train_nodes[0:{n - 1}]", "-i",
                                               inventory, "-f", str(n), "-e",
                                               "ansible_become=false", "-m", "ping")
                rows.append(sample)
            row = {"nodes": n, **median_of(rows)}
            results.append(row)
            print(json.dumps(row), flush=True)
    finally:
        sandbox_down(args.name)
    write_results(args.out, "seconds; train phases from the command's start (code unchanged "
                  "since the last sync, torch checked before), preflight and ansible -m ping "
                  "as commands; median of repeats", "sandbox containers", results,
                  ssh="through a bastion (ProxyJump)" if args.bastion else "direct")
    print("\n| nodes | `train` until torchrun on every node | until every rank runs | "
          "preflight part | sync part | launch part | `preflight` command | "
          "`ansible -m ping` |\n|---|---|---|---|---|---|---|---|")
    for r in results:
        m = {k: v["median_s"] for k, v in r.items() if isinstance(v, dict)}
        print(f"| {r['nodes']} | {m['until_torchrun']:.2f} s | {m['until_ranks']:.2f} s | "
              f"{m['preflight']:.2f} s | {m['sync']:.2f} s | {m['launch']:.2f} s | "
              f"{m['preflight_cli']:.2f} s | {m['ansible_ping']:.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
