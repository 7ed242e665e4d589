"""Benchmark: copying the training code to every node, first time and unchanged.

On one 8-node sandbox (no provisioning needed: only SSH and rsync), a code directory is
copied to every node two ways, side by side in one run:

  orchestrator  `sync_code`, what `train` runs before every launch: one ansible-runner
                play, `synchronize` (rsync) into a per-run snapshot, hard-linking files
                unchanged since the previous snapshot (--link-dest)
  copy          `ansible train_nodes -m ansible.builtin.copy` of the same directory
                (forks = nodes), the usual way to push files with Ansible

Each is timed for a first copy (nothing on the nodes) and a re-sync with nothing
changed: the orchestrator's sync --repeats times (median), `copy` once, since it takes
minutes (one module run per file per node). The code directory is this repository's
train/ plus generated files that make it look like a real project: 100 small modules and
one 20 MB binary asset. After the
orchestrator's re-sync the benchmark checks on every node that the new snapshot's files
are hard links to the previous one's (nothing was copied).

    python bench/code_sync.py [--nodes 8] [--repeats 3]

Writes bench/results/code_sync.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from sandbox_bench import HOME, REPO, sandbox_down, sandbox_up, sh  # puts REPO on sys.path

from orchestrator.cluster.inventory import load_cluster  # noqa: E402
from orchestrator.record.rundir import new_run_id  # noqa: E402
from orchestrator.run.command import CODE_SUBDIR, NODE_STATE_DIR  # noqa: E402
from orchestrator.run.sync import sync_code  # noqa: E402

COPY_DEST = "/var/lib/bench-copy"


def make_code(root: Path) -> dict:
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(REPO / "train", root, ignore=shutil.ignore_patterns("__pycache__"))
    pkg = root / "project"
    pkg.mkdir()
    for i in range(100):
        body = "".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(100))
        (pkg / f"module_{i:03d}.py").write_text(body)
    (root / "assets.bin").write_bytes(os.urandom(20 * 1024 * 1024))
    files = [p for p in root.rglob("*") if p.is_file()]
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


# The job user's snapshots on a node (the sandbox's login user trains).
CODE_ROOT = f"{HOME}/{NODE_STATE_DIR}/{CODE_SUBDIR}"


def clear_nodes(containers: list[str]) -> None:
    for c in containers:
        sh("podman", "exec", c, "rm", "-rf", CODE_ROOT, COPY_DEST)


def timed(fn) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def ansible_copy(inventory: str, n: int, code: Path) -> None:
    sh(str(Path(sys.executable).parent / "ansible"), "train_nodes", "-i", inventory,
       "-f", str(n), "-m", "ansible.builtin.copy",
       "-a", f"src={code}/ dest={COPY_DEST}/ mode=preserve")


def snapshots_hard_linked(containers: list[str], previous: str, current: str) -> bool:
    """Every file of the current snapshot shares its inode with the previous snapshot's."""
    script = (f"cd {CODE_ROOT} && find {current} -type f | while read f; do "
              f"[ \"$(stat -c %i \"$f\")\" = \"$(stat -c %i \"{previous}/${{f#{current}/}}\")\" ]"
              " || echo \"$f\"; done")
    return all(sh("podman", "exec", c, "sh", "-c", script).stdout.strip() == ""
               for c in containers)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default=f"sync-bench-{os.getpid()}")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "code_sync.json"))
    args = ap.parse_args()
    code = Path(f"/tmp/{args.name}/code")
    payload = make_code(code)
    info = sandbox_up(args.name, args.nodes)
    inventory = info["inventory"]
    containers = [n["container"] for n in info["nodes"]]
    cluster = load_cluster(inventory)
    times: dict[str, list[float]] = {k: [] for k in
                                     ("ours_first", "ours_resync", "copy_first", "copy_resync")}
    linked = True
    try:
        for _ in range(args.repeats):
            clear_nodes(containers)
            first_id = new_run_id()
            times["ours_first"].append(timed(functools.partial(sync_code, cluster, code, first_id)))
            second_id = new_run_id()
            times["ours_resync"].append(
                timed(functools.partial(sync_code, cluster, code, second_id)))
            linked = linked and snapshots_hard_linked(containers, first_id, second_id)
            print(json.dumps({k: round(v[-1], 2) for k, v in times.items() if v}), flush=True)
        clear_nodes(containers)
        times["copy_first"].append(timed(lambda: ansible_copy(inventory, args.nodes, code)))
        times["copy_resync"].append(timed(lambda: ansible_copy(inventory, args.nodes, code)))
        print(json.dumps({k: round(v[-1], 2) for k, v in times.items()}), flush=True)
    finally:
        sandbox_down(args.name)
        shutil.rmtree(code.parent, ignore_errors=True)
    med = {k: round(statistics.median(v), 2) for k, v in times.items()}
    result = {
        "what": f"seconds to copy a code directory to {args.nodes} sandbox nodes, measured "
                f"side by side; orchestrator: median of {args.repeats}, ansible copy: once",
        "machine": f"{os.cpu_count()} cores; sandbox containers on the same machine",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "payload": payload, "nodes": args.nodes,
        "median_s": med, "all_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
        "resync_hard_linked_everything": linked,
        "ratio_copy_over_ours": {"first": round(med["copy_first"] / med["ours_first"], 2),
                                 "resync": round(med["copy_resync"] / med["ours_resync"], 2)},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n| {args.nodes} nodes, {payload['files']} files, {payload['bytes'] / 2**20:.0f} MiB "
          "| orchestrator sync (s) | `ansible -m copy` (s) | ratio |\n|---|---|---|---|")
    for label, key in (("first copy", "first"), ("re-sync, nothing changed", "resync")):
        print(f"| {label} | {med['ours_' + key]:.1f} | {med['copy_' + key]:.1f} "
              f"| {result['ratio_copy_over_ours'][key]:.1f}x |")
    print(f"re-sync hard-linked every file: {linked}")
    return 0 if linked else 1


if __name__ == "__main__":
    sys.exit(main())
