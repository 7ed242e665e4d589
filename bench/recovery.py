"""Recovery from a dead node (`train --max-recoveries 1 --spares 1`): seconds from the
kill of a node's container (`podman kill`, as a power cut) until every rank of the
recovered run trains again (its first beat), over N trials at 3 nodes (2 and a spare),
with its parts apart: noticing the death, restarting torchrun (preflight, sync, launch on
the healthy node and the spare) and the first step after it (the checkpoint's load
reported alone). With --detach, the run is detached and nobody is attached: the nodes
recover it (node/recover.py); `attach` afterwards records it. The project's job
(train/train.py) on synthetic data. On a sandbox set
up for `train` without site.yml (sandbox_bench.bench_sandbox), removed afterwards, or on
--sandbox NAME (3 nodes or more, with cordons/ on its share):

    python bench/recovery.py [--sandbox NAME] [--trials 10] [--detach]

After each trial the killed node is started again and uncordoned.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from sandbox_bench import (  # REPO first
    ENV,
    REPO,
    bench_sandbox,
    sandbox_down,
    sh,
    write_results,
)

JOB = ["--epochs", "3", "--width", "8", "--batch-size", "32", "--log-every", "10"]
PARTS = ("kill_to_training_s", "detect_s", "restart_s", "resume_s", "load_s")


def orchestrator(*argv: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return sh(sys.executable, "-m", "orchestrator", *argv, timeout=timeout)


def at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def wait_ssh(inventory: str, node: str, timeout: float = 120) -> None:
    from orchestrator.cluster import ssh
    from orchestrator.cluster.inventory import load_cluster
    spec = next(n for n in load_cluster(inventory).nodes if n.name == node)
    ssh.wait_until_it_answers(spec.name, spec.ssh, timeout)


def ended(share: Path, attempt: str, nodes: tuple[str, ...]) -> bool:
    """Every node of ATTEMPT says on the share that its part ended."""
    states = share / "checkpoints" / "alice" / ".clustertrain" / "runs" / attempt
    try:
        return all(json.loads((states / f"{n}.json").read_text())["state"] == "ended"
                   for n in nodes)
    except (OSError, ValueError, KeyError):
        return False


def trial(i: int, info: dict, share: Path, detach: bool) -> dict:
    inventory = info["inventory"]
    victim = next(n for n in info["nodes"] if n["name"] == "node1")
    name = f"bench-recovery-{os.getpid()}-{i}"
    ckpts = share / "checkpoints" / "alice" / name
    runs = Path(tempfile.mkdtemp(prefix="recovery-"))
    out = open(runs / "train.out", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "train", "-i", inventory, "--runs-dir",
         str(runs), "--nodes", "2", "--max-recoveries", "1", "--spares", "1",
         *(["--detach"] if detach else []), "train.py",
         "--", "--run-name", name, *JOB], cwd=REPO, env=ENV, stdout=out,
        stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not list(ckpts.glob("*.pt")):
            gone = proc.poll() is not None and (not detach or proc.returncode != 0)
            if gone or time.monotonic() > deadline:
                raise SystemExit(f"no checkpoint:\n{(runs / 'train.out').read_text()[-3000:]}")
            time.sleep(0.2)
        killed = time.time()
        sh("podman", "kill", victim["container"])
        code = proc.wait(timeout=600)
        if detach:   # nobody attached: the nodes recover it; attach afterwards records it
            (run_id,) = [p.name for p in runs.iterdir() if (p / "run.json").exists()]
            while not ended(share, f"{run_id}.r1", ("node0", "node2")):
                if time.monotonic() > deadline + 600:
                    raise SystemExit(f"trial {i}: {run_id}.r1 never ended on the nodes")
                time.sleep(0.5)
            code = orchestrator("attach", run_id, "--runs-dir", str(runs)).returncode
    finally:
        proc.kill()
        subprocess.run(["podman", "start", victim["container"]], env=ENV, capture_output=True)
    text = (runs / "train.out").read_text()
    if code != 0:
        raise SystemExit(f"trial {i}: train exited {code}:\n{text[-3000:]}")
    (last,) = [json.loads(p.read_text()) for p in runs.glob("*.r1/summary.json")]
    (r,) = last["recoveries"]
    wait_ssh(inventory, "node1")
    orchestrator("uncordon", "node1", "-i", inventory)
    row = {"kill_to_training_s": round(at(r["training_again_at"]) - killed, 2),
           "detect_s": round(at(r["failed_at"]) - killed, 2),
           "restart_s": r["restart_s"], "resume_s": r["resume_s"], "load_s": r["load_s"],
           "steps_lost": r["steps_lost"], "resumed_from": r["resumed_from"]}
    print(f"trial {i + 1}: " + ", ".join(f"{k} {row[k]}" for k in PARTS), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sandbox", help="reuse this sandbox (3 nodes or more, cordons/ on "
                    "its share)")
    ap.add_argument("--name", default=f"recovery-bench-{os.getpid()}")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--detach", action="store_true",
                    help="detached, nobody attached: the nodes recover the run")
    ap.add_argument("--out", help="default: bench/results/recovery[-detached].json")
    args = ap.parse_args()
    args.out = args.out or str(REPO / "bench" / "results" / (
        "recovery-detached.json" if args.detach else "recovery.json"))
    if not args.sandbox:
        bench_sandbox(args.name, 3, bastion=False)
    try:
        info = json.loads(orchestrator("sandbox", "status", "--name",
                                       args.sandbox or args.name, "--json").stdout)
        share = Path(info["share"])
        (share / "cordons").mkdir(mode=0o1777, exist_ok=True)   # as the nfs_server role
        (share / "cordons").chmod(0o1777)
        if not (share / "data" / "cifar10").exists():
            orchestrator("data", "synthetic", "--dest", str(share / "data" / "cifar10"))
        rows = [trial(i, info, share, args.detach) for i in range(args.trials)]
    finally:
        if not args.sandbox:
            sandbox_down(args.name)
    medians = {k: round(statistics.median(r[k] for r in rows), 2) for k in PARTS}
    ranges = {k: [min(r[k] for r in rows), max(r[k] for r in rows)] for k in PARTS}
    write_results(
        args.out, "seconds from `podman kill` of node1's container, mid-run, until every "
        "rank of the recovered run (node0 and the spare node2) trains again (its first "
        "beat), with the parts: detect (kill -> the failure seen), restart (-> torchrun "
        "started again: preflight, sync, launch), resume (-> first step; load: the "
        "checkpoint's read). train --nodes 2 --max-recoveries 1 --spares 1"
        + (" --detach, nobody attached (the nodes recover it; detect: kill -> the nodes' "
           "decision)" if args.detach else "")
        + f", the project's job ({' '.join(JOB)}) on synthetic data, gloo on CPUs",
        "sandbox containers (3 nodes, no bastion); goal: median under 60 s",
        rows, trials=len(rows), median_s=medians, range_s=ranges)
    print(json.dumps({"median_s": medians, "range_s": ranges}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
