"""Benchmark: what Slurm's queue adds to `train` on an idle cluster: the time from the
command's start until every rank runs, for `train` over SSH, `train --queue` through Slurm,
and the same script by hand with `sbatch` + `srun` (torchrun on every node from the batch
script, the way a Slurm user writes it), side by side at 2 and 8 sandbox nodes.

The sandbox is bench_sandbox's (torch in a venv on the share, no site.yml) made with
`sandbox up --slurm`, then site.yml's Slurm play alone (playbooks/slurm.yml: two fake GPUs
per node, a test double). Each run starts a trivial script that writes the time on every
rank (bench/train_overhead.py's), and torchrun is the wrapper that writes the time it
starts on each node; the clocks are one clock (the containers share the host's kernel). So
each figure splits into the launch (until torchrun runs on every node: what the tool, or
Slurm, does) and torchrun's own start (torch imported from the share, through the
sandbox's FUSE layer: the same work in every column, and most of the spread). `train`
gets a warm-up run (torch checked, code synced); the hand-written job is submitted as alice
on node0 (`podman exec`, about as fast as an open SSH session), its script and the trivial
script on the share.

    python bench/queue_overhead.py [--sizes 2,8] [--repeats 3]

Writes bench/results/queue_overhead.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sandbox_bench import (  # REPO first
    ENV,
    REPO,
    bench_sandbox,
    node_exec,
    sandbox_down,
    sh,
    write_results,
)
from train_overhead import STAMPS, TORCHRUN, TRIVIAL, WRAPPER, stamps

BATCH = """#!/bin/bash
#SBATCH --job-name=bench-{tag}
#SBATCH --output={work}/{tag}.out
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --ntasks-per-node=1 bash -c "cd {work}/{tag} && exec {torchrun} --rdzv-id {tag} \\
  --nnodes $SLURM_NNODES --node-rank \\$SLURM_NODEID --nproc-per-node 1 \\
  --master-addr $head --master-port 29611 trivial.py"
"""
SHARED_WORK = "/mnt/cluster/bench-queue"   # the hand-written jobs' files, as the nodes see it


GRANTED = re.compile(r"granted after ([0-9.]+) s")
PHASES: dict[str, list[float]] = {"granted_s": []}   # --queue runs' phases


def until_ranks(argv: list[str], n: int, containers: list[str],
                runs: Path) -> tuple[float, float]:
    """Seconds from ARGV's start (a train) until torchrun ran on every node, and until the
    last of its ranks wrote its time. Of a --queue run, also how long Slurm's grant took
    (train says it), into PHASES."""
    t0 = time.time()
    done = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[3:8])}... on {n} nodes failed:\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    run_id = sorted(p.name for p in runs.iterdir())[-1]
    info = json.loads((runs / run_id / "run.json").read_text())
    used = [c for c in containers if c.rsplit("-", 1)[-1] in info["nodes"]]
    granted = GRANTED.search(done.stdout)
    if granted:
        PHASES["granted_s"].append(float(granted.group(1)))
    return (max(stamps(used, "torchrun", run_id)) - t0,
            max(stamps(used, "rank", run_id)) - t0)


def by_hand(share: Path, n: int, containers: list[str], tag: str) -> tuple[float, float]:
    """sbatch of BATCH as alice on node0: seconds until torchrun ran on every node, and
    until every rank wrote its time."""
    work = share / "bench-queue"
    (work / tag).mkdir(parents=True, exist_ok=True)
    (work / tag / "trivial.py").write_text(TRIVIAL)
    (work / f"{tag}.sh").write_text(BATCH.format(tag=tag, work=SHARED_WORK, torchrun=TORCHRUN))
    os.chmod(work, 0o777)
    t0 = time.time()
    node_exec(containers[0], f"sbatch -N {n} --gres=gpu:1 {SHARED_WORK}/{tag}.sh",
              user="alice")
    deadline = time.time() + 120
    while time.time() < deadline:
        times = stamps(containers, "rank", tag)
        if len([t for t in times if t == t]) >= n:   # NaN: no stamp on that node yet
            break
        time.sleep(0.2)
    else:
        raise SystemExit(f"sbatch on {n} nodes: ranks did not start; "
                         f"{(work / f'{tag}.out').read_text()[-2000:]}")
    while node_exec(containers[0], "squeue -h -u alice").strip():
        time.sleep(0.5)   # the next measurement starts on an idle cluster
    return (max(t for t in stamps(containers, "torchrun", tag) if t == t) - t0,
            max(t for t in stamps(containers, "rank", tag) if t == t) - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default=f"queue-bench-{os.getpid()}")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "queue_overhead.json"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(f"/tmp/{args.name}")
    (work / "code").mkdir(parents=True, exist_ok=True)
    (work / "code" / "trivial.py").write_text(TRIVIAL)
    info = bench_sandbox(args.name, max(sizes), False, torchrun=TORCHRUN, slurm=True)
    share = Path(info["share"])
    (share / Path(TORCHRUN).name).write_text(WRAPPER)
    (share / Path(TORCHRUN).name).chmod(0o755)
    inventory = info["inventory"]
    results: list[dict[str, Any]] = []
    try:
        t = time.time()
        sh(str(Path(sys.executable).parent / "ansible-playbook"), "-i", inventory,
           str(REPO / "playbooks" / "slurm.yml"),
           # no per-user GPU limit: one user's run takes a GPU on each of 8 nodes
           "-e", "slurm_max_gpus_per_user=0", timeout=3600)
        slurm_play = time.time() - t
        for n in sizes:
            containers = [x["container"] for x in info["nodes"]]
            train = [sys.executable, "-m", "orchestrator", "train", "-i", inventory,
                     "--nodes", str(n), "--workdir", str(work / "code")]
            runs = {k: work / f"runs-{k}-{n}" for k in ("ssh", "queue")}
            plain = [*train, "--runs-dir", str(runs["ssh"]), "trivial.py"]
            queued = [*train, "--queue", "--gpus-per-node", "1", "--runs-dir",
                      str(runs["queue"]), "trivial.py"]
            until_ranks(plain, n, containers, runs["ssh"])      # warm-up: torch, the sync
            until_ranks(queued, n, containers, runs["queue"])
            modes = ("train", "train_queue", "sbatch_srun")
            samples: dict[str, list[tuple[float, float]]] = {k: [] for k in modes}
            PHASES["granted_s"].clear()
            for i in range(args.repeats):
                samples["train"].append(until_ranks(plain, n, containers, runs["ssh"]))
                samples["train_queue"].append(until_ranks(queued, n, containers,
                                                          runs["queue"]))
                samples["sbatch_srun"].append(by_hand(share, n, containers, f"hand-{n}-{i}"))
            row: dict[str, Any] = {"nodes": n}
            for k, pairs in samples.items():
                for j, what in enumerate(("until_torchrun", "until_ranks")):
                    v = [p[j] for p in pairs]
                    row.setdefault(k, {})[what] = {"median_s": round(statistics.median(v), 3),
                                                   "all_s": [round(x, 3) for x in v]}
            row["queue_granted_s"] = [round(x, 3) for x in PHASES["granted_s"]]
            results.append(row)
            print(json.dumps(row), flush=True)
    finally:
        sandbox_down(args.name)
    write_results(args.out, "seconds from the command's start until torchrun runs on every "
                  "node, and until every rank runs, on an idle Slurm cluster: train over SSH, "
                  "train --queue, sbatch + srun by hand; median of repeats (train warmed up: "
                  "torch checked, code synced)",
                  "sandbox containers, Slurm 22.05 (Debian 12)", results,
                  slurm_play_s=round(slurm_play, 1), stamps=STAMPS)
    print("\n| nodes | until | `train` (SSH) | `train --queue` | `sbatch` + `srun` by hand |")
    print("|---|---|---|---|---|")
    for r in results:
        for what in ("until_torchrun", "until_ranks"):
            print(f"| {r['nodes']} | {what.split('_')[1]} | " + " | ".join(
                f"{r[k][what]['median_s']:.2f} s" for k in
                ("train", "train_queue", "sbatch_srun")) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
