"""Benchmark: `train` against torchrun typed by hand over ssh on every node, whole command
to whole command, on 3 sandbox nodes, a trivial gloo script and code already on the nodes.

By hand is what a user without the tool types: one `ssh NODE 'cd DIR && torchrun --nnodes 3
--node-rank I --master-addr node0 --master-port P script.py'` per node, all at once, the
wall time until the last ssh returns. `train` is `python -m orchestrator train --nodes 3
--workdir DIR script.py` after a warm-up run (torch checked, the code synced: the snapshot is
linked, not copied; its bytecode cached, see with_train), the wall time until the command
returns, and its parts as its output shows them (each line's arrival is timed): preflight
(until "syncing"), the sync (until "starting torchrun"), the launch and the script (until
the last rank's "finished" line) and the end (until the command returns: torchrun's exit on
every node, the supervisors' records, the summary and the report). The two kinds
alternate, pair by pair.

The sandbox is bench_sandbox's (torch in a venv on the share, no site.yml), nodes reached
directly over SSH as alice, as the inventory reaches them.

    python bench/train_vs_torchrun.py [--pairs 6] [--case unchanged|edited|both]

Two cases, each in pairs of its own: `unchanged` (the code already on the nodes: by hand
runs the script from the share, `train` links its snapshot) and `edited`, the edit-and-run
loop: one file of a small tree (the script and a few modules) changed before every run of
either kind; by hand then copies the tree to every node with rsync over ssh (all at once)
before its torchrun, as a user without the tool does; `train` syncs it itself.

Writes bench/results/train_vs_torchrun.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sandbox_bench import ENV, REPO, VENV, bench_sandbox, sandbox_down, write_results

NODES = 3
PORT = 29650
SCRIPT = """import torch.distributed as dist
import params
dist.init_process_group("gloo")
dist.barrier()
print("rank", dist.get_rank(), "of", dist.get_world_size(), flush=True)
dist.destroy_process_group()
"""
HAND_DIR = "/mnt/cluster/bench-by-hand"   # the script, on the share: already on every node
HAND_COPY = "bench-by-hand"   # in the login user's home on each node: the edited case's copy
MODULES = 4   # the small tree: the script, params.py (the file edited) and these
MARKS = (("preflight_s", "syncing "), ("sync_s", "starting torchrun"))


def code_tree(root: Path) -> Path:
    """The small tree of the edited case: the script, params.py and a few modules."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "script.py").write_text(SCRIPT)
    for i in range(MODULES):
        (root / f"module{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 50)
    edit(root)
    return root


def edit(root: Path) -> None:
    """The one file changed before each run of the edited case."""
    (root / "params.py").write_text(f"LR = {time.time_ns()}\n")


def rsync_by_hand(ssh_config: str, names: list[str], code: Path) -> None:
    """The tree copied to every node at once, as a user types it: rsync over ssh."""
    procs = [subprocess.Popen(["rsync", "-a", "--delete", "-e", f"ssh -F {ssh_config}",
                               f"{code}/", f"{name}:{HAND_COPY}/"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name in names]
    for p in procs:
        out = p.communicate(timeout=300)[0]
        if p.returncode:
            raise SystemExit(f"rsync by hand failed: {out[-1500:]}")


def by_hand(ssh_config: str, names: list[str], code: Path | None = None) -> float:
    """Seconds until torchrun, started over ssh on every node at once, ended on all; with
    CODE, after the tree was copied to every node (rsync_by_hand), counted in."""
    t0 = time.monotonic()
    where = HAND_DIR
    if code is not None:
        rsync_by_hand(ssh_config, names, code)
        where = HAND_COPY
    procs = [subprocess.Popen(
        ["ssh", "-F", ssh_config, name,
         f"cd {where} && {VENV}/bin/torchrun --nnodes {NODES} --node-rank {rank} "
         f"--nproc-per-node 1 --master-addr {names[0]} --master-port {PORT} script.py"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank, name in enumerate(names)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    took = time.monotonic() - t0
    if any(p.returncode for p in procs):
        raise SystemExit("torchrun by hand failed:\n" + "\n".join(o[-1500:] for o in outs))
    return took


def with_train(inventory: str, work: Path, runs: Path) -> dict[str, float]:
    """train's wall time and its parts, read from the moment each of its lines came. Its
    Python keeps its bytecode (in a cache of the benchmark's own), as a user's does: an
    environment that says PYTHONDONTWRITEBYTECODE (this machine's does) would have it
    compile the tool's modules on every command, a cost no user pays."""
    env = {k: v for k, v in ENV.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(work.parent / "pycache")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "train", "-i", inventory,
                             "--nodes", str(NODES), "--workdir", str(work), "--runs-dir",
                             str(runs), "script.py"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict[str, float] = {}
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.monotonic() - t0
        lines.append(line)
        for key, text in MARKS:
            if text in line and key not in seen:
                seen[key] = now
        if "finished: exit code" in line:
            seen["ranks_done"] = now
    total = time.monotonic() - t0
    if proc.wait() != 0 or "ranks_done" not in seen:
        raise SystemExit("train failed:\n" + "".join(lines)[-3000:])
    return {"total_s": total, "preflight_s": seen["preflight_s"],
            "sync_s": seen["sync_s"] - seen["preflight_s"],
            "launch_and_script_s": seen["ranks_done"] - seen["sync_s"],
            "end_s": total - seen["ranks_done"]}


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def pairs(case: str, count: int, info: dict, names: list[str], work: Path) -> dict:
    """COUNT pairs of CASE (unchanged, edited), alternating, after a warm-up of each kind."""
    code = work / case
    runs = work / "runs"
    if case == "edited":
        code_tree(code)
    else:
        code.mkdir(parents=True, exist_ok=True)
        (code / "script.py").write_text(SCRIPT)
        (code / "params.py").write_text("LR = 0\n")
    hand_code = code if case == "edited" else None
    with_train(info["inventory"], code, runs)   # warm-up: torch, the first sync
    by_hand(info["ssh_config"], names, hand_code)
    trains, hands = [], []
    for _ in range(count):
        if case == "edited":
            edit(code)
        trains.append(with_train(info["inventory"], code, runs))
        if case == "edited":
            edit(code)
        hands.append(by_hand(info["ssh_config"], names, hand_code))
        print(json.dumps({"case": case, "train": trains[-1], "by_hand_s": hands[-1]}),
              flush=True)
    return {"case": case, "nodes": NODES, "pairs": count, "by_hand_s": median(hands),
            "by_hand_all_s": [round(h, 3) for h in hands],
            "train": {k: median([t[k] for t in trains]) for k in trains[0]},
            "train_all_s": [round(t["total_s"], 3) for t in trains],
            "ratios": [round(trains[i]["total_s"] / hands[i], 3) for i in range(count)],
            "ratio": round(statistics.median(trains[i]["total_s"] / hands[i]
                                             for i in range(count)), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--case", choices=("unchanged", "edited", "both"), default="both")
    ap.add_argument("--name", default=f"tvt-bench-{os.getpid()}")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" /
                                         "train_vs_torchrun.json"))
    args = ap.parse_args()
    work = Path(f"/tmp/{args.name}")
    info = bench_sandbox(args.name, NODES, False)
    try:
        hand = Path(info["share"]) / Path(HAND_DIR).name
        hand.mkdir(exist_ok=True)
        (hand / "script.py").write_text(SCRIPT)
        (hand / "params.py").write_text("LR = 0\n")
        names = [n["name"] for n in info["nodes"] if not n["outsider"]][:NODES]
        cases = ("unchanged", "edited") if args.case == "both" else (args.case,)
        rows = [pairs(case, args.pairs, info, names, work) for case in cases]
    finally:
        sandbox_down(args.name)
    write_results(args.out, "whole-command wall time: train against torchrun by hand over "
                  "ssh on every node (3 nodes, a trivial gloo script); unchanged: code "
                  "already there; edited: one file of a small tree changed before each run, "
                  "by hand rsyncs it first; medians of pairs run alternately, train's parts "
                  "from its output", "sandbox containers (Debian 12), direct SSH", rows)
    print("\n| case | by hand | train | ratio | preflight | sync | launch + script | end |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        t = row["train"]
        print(f"| {row['case']} | {row['by_hand_s']:.2f} s | {t['total_s']:.2f} s | "
              f"{row['ratio']:.2f}x | {t['preflight_s']:.2f} s | {t['sync_s']:.2f} s | "
              f"{t['launch_and_script_s']:.2f} s | {t['end_s']:.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
