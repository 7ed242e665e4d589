"""Benchmark: alice's `preflight` with bob's flood of cordon events on her node, against the
same preflight without it, on the real-site sandbox (alice and bob, a bastion, the share).

bob writes 3000 events of his own to the share's `cordons/` (half of them of alice's node
0, half of 1500 made-up nodes), as the attack of issue 67 did with 32 000. The two cases
go in turn (without, with, without, ...), the flood moved aside by root between turns (on
the share's host directory), so that a drift of the machine's speed falls on both; the
ratio is taken pair by pair. Each figure is the wall clock of the whole `preflight`
command as alice runs it.

    python -m tests.shared_cluster up NAME      # once: a provisioned real-site sandbox
    python bench/cordon_flood.py --sandbox NAME [--pairs 7] [--events 3000] [--out FILE]

Writes bench/results/cordon_flood.json (each turn's times, the ratios, their median) and
prints a line for bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sandbox_bench import ENV, REPO, write_results

BIN = Path(sys.executable).parent
FLOOD = ("import json, sys\n"
         "for i in range(int(sys.argv[3])):\n"
         "    node = 'fake%d' % (i % 1500) if i % 2 else sys.argv[1]\n"
         "    name = '%s/%s@%d@bob.json' % (sys.argv[2], node, 10**18 + i)\n"
         "    with open(name, 'w') as fh:\n"
         "        json.dump({'node': node, 'action': 'uncordon', 'why': 'flood'}, fh)\n")


def status(name: str) -> dict:
    done = subprocess.run([str(BIN / "python"), "-m", "orchestrator", "sandbox", "status",
                           "--name", name, "--json"], env=ENV, cwd=REPO, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


def preflight(inventory: str) -> float:
    started = time.perf_counter()
    done = subprocess.run([str(BIN / "python"), "-m", "orchestrator", "preflight", "-i",
                           inventory, "--nodes", "2"], env=ENV, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"alice's preflight failed:\n{done.stdout[-3000:]}{done.stderr}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sandbox", required=True, help="a sandbox of tests.shared_cluster")
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--events", type=int, default=3000)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "cordon_flood.json"))
    args = ap.parse_args()
    info = status(args.sandbox)
    alice = info["users"]["alice"]["inventory"]
    node0 = next(n for n in info["nodes"] if not n["outsider"])
    cordons = Path(info["share"]) / "cordons"
    aside = Path(info["share"]) / ".bench-flood-aside"
    before = {p.name for p in cordons.iterdir()}
    made = subprocess.run(["podman", "exec", "-i", node0["container"], "runuser", "-l", "bob",
                           "-c", f"python3 - {node0['name']} /mnt/cluster/cordons "
                           f"{args.events}"], input=FLOOD, text=True, capture_output=True,
                          env=ENV, timeout=900)
    if made.returncode != 0:
        raise SystemExit(f"bob's flood failed: {made.stderr}")
    flood = sorted({p.name for p in cordons.iterdir()} - before)
    aside.mkdir(exist_ok=True)
    turns = []
    try:
        preflight(alice)   # warm: the first connection's costs fall on neither case
        for _ in range(args.pairs):
            for name in flood:
                (cordons / name).rename(aside / name)
            alone = preflight(alice)
            for name in flood:
                (aside / name).rename(cordons / name)
            flooded = preflight(alice)
            turns.append({"alone_s": round(alone, 3), "flooded_s": round(flooded, 3),
                          "ratio": round(flooded / alone, 3)})
            print(f"alone {alone:.2f} s, with bob's {len(flood)} events {flooded:.2f} s",
                  flush=True)
    finally:
        for p in aside.iterdir():
            p.unlink()
        aside.rmdir()
        for name in flood:
            (cordons / name).unlink(missing_ok=True)
    median = {k: statistics.median(t[k] for t in turns) for k in turns[0]}
    write_results(args.out, "alice's `preflight --nodes 2` with and without bob's cordon "
                  "events on her node 0", "the real-site sandbox (3 nodes, a bastion)",
                  turns, events=len(flood), median=median)
    print(f"| {len(flood)} | {median['alone_s']:.2f} s | {median['flooded_s']:.2f} s | "
          f"{median['ratio']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
