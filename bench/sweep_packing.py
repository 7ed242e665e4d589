"""Benchmark: how well a sweep through Slurm's queue packs its trials (issue 51). A
12-trial grid of the project's job (train/train.py, --lr x --width, 2 epochs on the
sandbox's small CIFAR-10 stand-in) on a 3-node sandbox with Slurm and two fake GPUs per
node (a test double: Slurm's gres, no GPU), `queue: true`, one GPU per trial.

From Slurm's accounting (sacct) of the 12 allocations: how many ran at once, at most, and
the most GPUs of one node held at once; the ideal packing of the allocations' own
durations onto the GPUs one user may hold (the cluster's, or fewer under a QOS's
MaxTRESPerUser: the sandbox's group_vars give 4; a lower bound: the longest trial, or
their sum over those GPUs, whichever is more); and the sweep's wall time against it. Run
once as the site is, and once with the per-user limit lifted for the run (sacctmgr, as
root on node0; put back afterwards).

    python bench/sweep_packing.py --inventory INVENTORY [--epochs 2]

INVENTORY: a sandbox provisioned by site.yml with Slurm (the tests' shared cluster:
`python -m tests.shared_cluster up s1`, then ~/.local/state/clustertrain/sandboxes/s1/
inventory.yml). Writes bench/results/sweep_packing.json and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from sandbox_bench import ENV, REPO, write_results

SWEEP = """\
inventory: {inventory}
workdir: {repo}/train
script: train.py
nodes: 1
queue: true
gpus_per_node: 1
args: [--epochs, "{epochs}", --no-resume]
sweep:
  method: grid
  parameters:
    --lr: [0.2, 0.1, 0.05]
    --width: [4, 8, 12, 16]
  metric: test_loss
"""


def node0(inventory: Path, command: str) -> str:
    """COMMAND on the sandbox's node0, as its login user (through the orchestrator's SSH
    config is not needed: podman exec into the container of the inventory's sandbox)."""
    name = inventory.parent.name
    return subprocess.run(["podman", "exec", f"{name}-node0", "sh", "-c", command], env=ENV,
                          capture_output=True, text=True, check=True).stdout


def stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def concurrency(spans: list[tuple[float, float, str]]) -> tuple[int, int]:
    """The most allocations at once, and the most of one node at once (one GPU each)."""
    events = sorted([(s, 1, n) for s, _, n in spans] + [(e, -1, n) for _, e, n in spans])
    now, most, most_per = 0, 0, 0
    per: dict[str, int] = {}
    for _, step, node in events:   # an end before a start at the same second
        now += step
        per[node] = per.get(node, 0) + step
        most, most_per = max(most, now), max(most_per, per[node])
    return most, most_per


def user_limit(inventory: Path) -> int:
    """The fewest GPUs one user may hold under any QOS (0: no such limit)."""
    said = node0(inventory, "sacctmgr -n -P show qos format=MaxTRESPU")
    found = [int(x.split("=")[1]) for x in said.replace(",", " ").split()
             if x.startswith("gres/gpu=")]
    return min(found, default=0)


def one_sweep(inventory: Path, epochs: int, gpus: int) -> dict:
    limit = user_limit(inventory)
    capacity = min(gpus, limit) if limit else gpus
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        sweep = Path(tmp) / "sweep.yaml"
        sweep.write_text(SWEEP.format(inventory=inventory.absolute(), repo=REPO,
                                      epochs=epochs))
        started = time.time()
        ran = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "-f", str(sweep),
                              "--runs-dir", f"{tmp}/runs"], cwd=REPO, env=ENV,
                             capture_output=True, text=True, timeout=3600)
        wall = time.time() - started
        print(ran.stdout[-1800:])
        if ran.returncode != 0:
            raise SystemExit(f"the sweep failed:\n{ran.stderr[-2000:]}")
        [record] = [json.loads(p.read_text()) for p in Path(tmp, "runs").glob("*/sweep.json")]
    names = ",".join(f"clustertrain-{t['run_id']}" for t in record["trials"])
    rows = node0(inventory, f"sacct -X -P -n -a -o JobName%80,NodeList,Start,End "
                            f"--name {names} -S now-3hours")
    spans = [(stamp(s), stamp(e), node) for _, node, s, e in
             (line.split("|") for line in rows.splitlines() if line)]
    durations = [e - s for s, e, _ in spans]
    ideal = max(max(durations), sum(durations) / capacity)
    most, most_per_node = concurrency(spans)
    best = min((t for t in record["trials"] if t["metric"] is not None),
               key=lambda t: t["metric"])
    return {"trials": len(record["trials"]), "gpus": gpus,
            "gpus_one_user_may_hold": limit or None, "epochs": epochs,
            "succeeded": sum(t["state"] == "succeeded" for t in record["trials"]),
            "allocations": len(spans), "sweep_wall_s": round(wall, 1),
            "allocation_s": [round(d, 1) for d in durations],
            "ideal_s": round(ideal, 1), "wall_over_ideal": round(wall / ideal, 2),
            "most_at_once": most, "most_gpus_of_a_node_at_once": most_per_node,
            "best": " ".join(w for pair in best["values"] for w in pair)}


@contextmanager
def lifted(inventory: Path):
    """No per-user GPU limit on any QOS while the block runs; each put back afterwards."""
    said = node0(inventory, "sacctmgr -n -P show qos format=Name,MaxTRESPU")
    limited = [line.split("|") for line in said.splitlines() if "gres/gpu=" in line]
    for name, _ in limited:
        node0(inventory, f"sacctmgr -i modify qos {name} set MaxTRESPerUser=gres/gpu=-1")
    try:
        yield
    finally:
        for name, tres in limited:
            node0(inventory, f"sacctmgr -i modify qos {name} set MaxTRESPerUser={tres}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inventory", type=Path, required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "sweep_packing.json"))
    args = p.parse_args()
    gpus = sum(int(x.split(":")[-1]) for x in node0(
        args.inventory, "sinfo -h -N -o %G").split() if x.startswith("gpu"))
    results = [one_sweep(args.inventory, args.epochs, gpus)]
    with lifted(args.inventory):
        results.append(one_sweep(args.inventory, args.epochs, gpus))
    write_results(args.out, "a 12-trial sweep through Slurm's queue: its packing, with the "
                  "site's per-user GPU limit and without", "3 sandbox nodes with Slurm, 2 "
                  "fake GPUs each (gres test double)", results)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
