"""Benchmark: `env create` of the project's environment.yml from the offline wheelhouse on
the share, on 1, 3 and 8 sandbox nodes at once, and its no-change re-run; the goal: 8 nodes
within 1.5x the time of one.

One sandbox of the largest size (no site.yml: env create needs the nodes' python3 and SSH
as the login user, nothing more); each size makes its own environment (its own name) on the
first N nodes and removes it after its re-run. The environment is a venv (the sandbox's
inventory: python_env_backend venv) with torch and the rest from the wheelhouse.

    python bench/env_create.py [--sizes 1,3,8] [--small]

--small makes an environment of one small package (tabulate, a 40 kB wheel) instead: the
nodes' own work is then a venv and one wheel, and what grows with the nodes is the tool's
(the playbook's fan-out, SSH, the fingerprints read and compared).

Writes bench/results/env_create.json (--small: env_create_small.json) and prints a
markdown table.
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
RESULTS = REPO / "bench" / "results"
SMALL = """name: small
dependencies:
  - python=3.11
  - pip
  - pip:
      - tabulate==0.10.0
"""


def create(inventory: str, name: str, nodes: int, spec: Path) -> tuple[float, str]:
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "orchestrator", "env", "create", "-f",
                        str(spec), "--name", name, "--wheelhouse",
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
    ap.add_argument("--small", action="store_true",
                    help="one small package instead of environment.yml (the tool's own cost)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    spec, wheels = REPO / "environment.yml", WHEELHOUSE
    if args.small:
        spec = Path(f"/tmp/{args.name}-small.yml")
        spec.write_text(SMALL)
        wheels = Path(f"/tmp/{args.name}-small-wheels")
        shutil.rmtree(wheels, ignore_errors=True)
    sandbox_down(args.name)
    info = sandbox_up(args.name, max(sizes))
    results: list[dict[str, Any]] = []
    try:
        sh(sys.executable, "-m", "orchestrator", "wheelhouse", "--env", str(spec),
           "--dest", str(wheels))
        shutil.copytree(wheels, Path(info["share"]) / "wheelhouse", copy_function=os.link)
        for n in sizes:
            name = f"bench{n}"
            first, said = create(info["inventory"], name, n, spec)
            again, said_again = create(info["inventory"], name, n, spec)
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
    out = RESULTS / ("env_create_small.json" if args.small else "env_create.json")
    what = "one small package (tabulate)" if args.small else "environment.yml"
    write_results(str(out), f"seconds of `env create` of {what} (venv, from the "
                  "wheelhouse on the share) on N nodes at once, and of its re-run",
                  "sandbox containers (Debian 12, python 3.11)", results)
    print("| nodes | env create | re-run | vs 1 node |\n|---|---|---|---|")
    for r in results:
        print(f"| {r['nodes']} | {r['create_s']:.1f} s | {r['rerun_s']:.1f} s | "
              f"{r['vs_one']}x |")


if __name__ == "__main__":
    main()
