"""Benchmark: the `preflight` command against `ansible -m ping` on the same nodes, side by
side: the two commands in turn (preflight, ping, preflight, ping, ...) on the first N nodes
of one sandbox, so that a drift of the machine's speed falls on both, and the ratio taken
pair by pair. Wall clock of each whole command, with bytecode kept as on a user's machine
(this machine's PYTHONDONTWRITEBYTECODE is dropped for both).

`ansible -m ping` as a user runs it keeps its SSH connections open between runs (ansible.cfg:
ControlPersist=300s), so after the first run it makes no SSH handshake; preflight opens its
own connections and closes them (nothing of it is left running). A third command in each
turn, the ping without a kept connection (ControlMaster=no), is the like-for-like figure.

The sandbox is bench_sandbox's (no site.yml: torch and its torchrun in a venv on the share,
or with --env-on-nodes on each node's own disk, where site.yml puts the cluster's).

    python bench/preflight_vs_ping.py [--sizes 3,8] [--pairs 15] [--env-on-nodes] [--out FILE]

Writes bench/results/preflight_vs_ping.json (medians, each turn's times and the ratios
pair by pair) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sandbox_bench import ENV, REPO, bench_sandbox, sandbox_down, sh, write_results


def timed(*argv: str, env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    if env is None:
        sh(*argv)
    else:
        subprocess.run(argv, env=env, capture_output=True, check=True, timeout=900)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="3,8")
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--name", default=f"pvp-bench-{os.getpid()}")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "preflight_vs_ping.json"))
    ap.add_argument("--env-on-nodes", action="store_true",
                    help="the environment on each node's own disk, as site.yml puts it "
                    "(default: one venv on the share, quicker to set up)")
    args = ap.parse_args()
    ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    sizes = [int(s) for s in args.sizes.split(",")]
    inventory = bench_sandbox(args.name, max(sizes), False,
                              env_on_nodes=args.env_on_nodes)["inventory"]
    ansible = str(Path(sys.executable).parent / "ansible")
    results = []
    try:
        for n in sizes:
            preflight = (sys.executable, "-m", "orchestrator", "preflight", "-i", inventory,
                         "--nodes", str(n))
            ping = (ansible, f"train_nodes[0:{n - 1}]", "-i", inventory, "-f", str(n), "-e",
                    "ansible_become=false", "-m", "ping")
            cold = {**ENV, "ANSIBLE_SSH_ARGS": "-o ControlMaster=no"}
            timed(*preflight), timed(*ping)   # warm-up: torch checked, bytecode written
            turns = [(timed(*preflight), timed(*ping), timed(*ping, env=cold))
                     for _ in range(args.pairs)]
            ratios = sorted(a / b for a, b, _ in turns)
            cold_ratios = sorted(a / c for a, _, c in turns)
            row = {"nodes": n, "preflight_s": round(statistics.median(t[0] for t in turns), 3),
                   "ping_s": round(statistics.median(t[1] for t in turns), 3),
                   "ping_cold_s": round(statistics.median(t[2] for t in turns), 3),
                   "ratio_median": round(statistics.median(ratios), 3),
                   "ratio_min": round(ratios[0], 3), "ratio_max": round(ratios[-1], 3),
                   "cold_ratio_median": round(statistics.median(cold_ratios), 3),
                   "cold_ratio_min": round(cold_ratios[0], 3),
                   "cold_ratio_max": round(cold_ratios[-1], 3),
                   "turns_s": [[round(x, 3) for x in t] for t in turns]}
            results.append(row)
            print(row, flush=True)
    finally:
        sandbox_down(args.name)
    write_results(args.out, "`preflight` command against `ansible -m ping`, in turn",
                  "direct SSH, the benchmark's own sandbox, bytecode kept", results,
                  pairs=args.pairs,
                  environment="on each node's disk" if args.env_on_nodes else "on the share")
    print("\n| nodes | `preflight` | ping (kept connections) | ratio | ping (new connections) "
          "| ratio |\n|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['nodes']} | {r['preflight_s']:.2f} s | {r['ping_s']:.2f} s | "
              f"{r['ratio_median']:.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) | "
              f"{r['ping_cold_s']:.2f} s | {r['cold_ratio_median']:.2f}x "
              f"({r['cold_ratio_min']:.2f}-{r['cold_ratio_max']:.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
