"""Benchmark: provisioning time of site.yml with the project's ansible.cfg versus Ansible's
defaults, side by side in one run.

For each configuration a fresh sandbox of N nodes is provisioned twice: the first run
(everything installed: packages from Debian's mirror, torch from the wheelhouse) and the
idempotent re-run (changed=0). "defaults" means an empty ansible.cfg: 5 forks, no
pipelining, Ansible's own ControlPersist of 60 s, implicit fact gathering without a cache.
Only the roles path is set there too, since the playbooks cannot run without it.

    python bench/provision.py [--nodes 2] [--order defaults,project] [--out FILE]

Writes bench/results/provision-<N>nodes.json and prints a markdown table. Each configuration gets
its own sandbox at the same time of day from the same mirror; the package downloads of the
first run are part of what is measured, so run both in one go and read them as a ratio.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandbox_bench import ENV, REPO, sandbox_down, sandbox_up

BIN = Path(sys.executable).parent
RESULTS_DIR = REPO / "bench" / "results"
WHEELHOUSE = REPO / ".cache" / "wheelhouse"


def sh(*argv: str, env: dict | None = None, timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def changed_total(stdout: str) -> int:
    recap = stdout[stdout.rindex("PLAY RECAP"):]
    return sum(int(n) for n in re.findall(r"changed=(\d+)", recap))


def provision_twice(config: str, nodes: int, cfg_dir: Path) -> dict:
    name = f"bench-prov-{config}"
    sandbox_down(name)
    info = sandbox_up(name, nodes)
    try:
        shutil.copytree(WHEELHOUSE, Path(info["share"]) / "wheelhouse",
                        copy_function=os.link)
        env = dict(ENV)  # the project's ansible.cfg
        if config != "project":
            empty = cfg_dir / "ansible.cfg"
            empty.write_text("[defaults]\n")
            env.update(ANSIBLE_CONFIG=str(empty), ANSIBLE_ROLES_PATH=str(REPO / "roles"))
        runs = []
        for label in ("first", "rerun"):
            start = time.monotonic()
            proc = sh(str(BIN / "ansible-playbook"), "-i", info["inventory"], "site.yml",
                      env=env)
            seconds = time.monotonic() - start
            if proc.returncode != 0:
                raise SystemExit(f"{config} {label} run failed:\n{proc.stdout[-4000:]}")
            runs.append({"run": label, "seconds": round(seconds, 1),
                         "changed": changed_total(proc.stdout)})
            print(f"{config:>8} {label:>5}: {seconds:6.1f} s, changed={runs[-1]['changed']}",
                  flush=True)
        return {"config": config, "runs": runs}
    finally:
        sandbox_down(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--order", default="defaults,project")
    parser.add_argument("--out", type=Path, default=None,
                        help="results file (default: bench/results/provision-<N>nodes.json)")
    args = parser.parse_args()
    wh = sh(sys.executable, "-m", "orchestrator", "wheelhouse", "--env", "environment.yml",
            "--dest", str(WHEELHOUSE))
    if wh.returncode != 0:
        raise SystemExit(wh.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        results = [provision_twice(c, args.nodes, Path(tmp)) for c in args.order.split(",")]
    by = {r["config"]: {x["run"]: x for x in r["runs"]} for r in results}
    ratios = {run: round(by["defaults"][run]["seconds"] / by["project"][run]["seconds"], 2)
              for run in ("first", "rerun")} if {"defaults", "project"} <= set(by) else {}
    out = {
        "what": "seconds for `ansible-playbook site.yml` on a fresh sandbox: first run and "
                "idempotent re-run, project ansible.cfg vs Ansible defaults",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                   f"load average {os.getloadavg()[0]:.1f} at the end",
        "nodes": args.nodes, "results": results, "defaults_over_project": ratios,
    }
    path = args.out or RESULTS_DIR / f"provision-{args.nodes}nodes.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print("\n| config | first run | re-run (changed) |\n|---|---:|---:|")
    for r in results:
        first, rerun = r["runs"]
        print(f"| {r['config']} | {first['seconds']} s | {rerun['seconds']} s "
              f"({rerun['changed']}) |")
    if ratios:
        print(f"| defaults / project | {ratios['first']}x | {ratios['rerun']}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
