"""Benchmark: `env create` of the project's environment.yml from the offline wheelhouse on
the share, on 1, 3 and 8 sandbox nodes at once, and its no-change re-run; the goal: 8 nodes
within 1.5x the time of one.

One sandbox of the largest size (no site.yml: env create needs the nodes' python3 and SSH
as the login user, nothing more); each size makes its own environment (its own name) on the
first N nodes and removes it after its re-run. The environment is a venv (the sandbox's
inventory: python_env_backend venv) with torch and the rest from the wheelhouse.

    python bench/env_create.py [--sizes 1,3,8]

Writes bench/results/env_create.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sandbox_bench import ENV, REPO, sandbox_down, sandbox_up, sh, write_results

WHEELHOUSE = REPO / ".cache" / "wheelhouse"
OUT = REPO / "bench" / "results" / "env_create.json"


def create(inventory: str, name: str, nodes: int) -> tuple[float, str]:
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "orchestrator", "env", "create", "-f",
                        str(REPO / "environment.yml"), "--name", name, "--wheelhouse",
                        "/mnt/cluster/wheelhouse", "--nodes", str(nodes), "-i", inventory],
                       cwd=REPO, env=ENV, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - started
    if p.returncode != 0:
        raise SystemExit(f"env create {name} failed:\n{p.stdout[-3000:]}{p.stderr[-2000:]}")
    return seconds, p.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,3,8")
    ap.add_argument("--name", default="bench-env")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    sandbox_down(args.name)
    info = sandbox_up(args.name, max(sizes))
    results: list[dict[str, Any]] = []
    try:
        sh(sys.executable, "-m", "orchestrator", "wheelhouse", "--env",
           str(REPO / "environment.yml"), "--dest", str(WHEELHOUSE))
        shutil.copytree(WHEELHOUSE, Path(info["share"]) / "wheelhouse",
                        copy_function=os.link)
        for n in sizes:
            name = f"bench{n}"
            first, said = create(info["inventory"], name, n)
            again, said_again = create(info["inventory"], name, n)
            print(f"{n} node(s): {first:.1f} s, re-run {again:.1f} s", flush=True)
            results.append({"nodes": n, "create_s": round(first, 2),
                            "rerun_s": round(again, 2), "said": said,
                            "said_again": said_again})
            sh(sys.executable, "-m", "orchestrator", "env", "rm", name, "--nodes", str(n),
               "-i", info["inventory"])
    finally:
        sandbox_down(args.name)
    one = next((r["create_s"] for r in results if r["nodes"] == 1), None)
    for r in results:
        r["vs_one"] = round(r["create_s"] / one, 2) if one else None
    write_results(str(OUT), "seconds of `env create` of environment.yml (venv, from the "
                  "wheelhouse on the share) on N nodes at once, and of its re-run",
                  "sandbox containers (Debian 12, python 3.11)", results)
    print("| nodes | env create | re-run | vs 1 node |\n|---|---|---|---|")
    for r in results:
        print(f"| {r['nodes']} | {r['create_s']:.1f} s | {r['rerun_s']:.1f} s | "
              f"{r['vs_one']}x |")


if __name__ == "__main__":
    main()
