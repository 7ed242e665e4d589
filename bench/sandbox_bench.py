"""What the sandbox benchmarks share: the repository on sys.path, the environment podman
and Ansible need, a command runner that stops the benchmark on failure, sandbox up/down,
a sandbox set up for `train` without site.yml (bench_sandbox), and the results file
(write_results)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / "sandbox" / "containers.conf"),
       "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}


def sh(*argv: str, timeout: int = 900) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])}... failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p


def sandbox_up(name: str, nodes: int, bastion: bool = False, slurm: bool = False) -> dict:
    """`sandbox up --json`: its nodes (name, address, container), inventory and share.
    With BASTION, the nodes are reachable only through a bastion (ProxyJump); with SLURM,
    its inventories say cluster_scheduler: slurm."""
    return json.loads(sh(sys.executable, "-m", "orchestrator", "sandbox", "up", "--nodes",
                         str(nodes), "--name", name, "--json",
                         *(["--bastion"] if bastion else []),
                         *(["--slurm"] if slurm else [])).stdout)


def sandbox_down(name: str) -> None:
    subprocess.run([sys.executable, "-m", "orchestrator", "sandbox", "down", "--name", name],
                   env=ENV, capture_output=True)


VENV = "/mnt/cluster/bench-venv"   # torch, installed once on the share for every node
LOCAL_VENV = "/opt/bench-venv"     # or on each node's own disk (env_on_nodes)
USER = "alice"                     # the sandbox's login user: jobs run as alice
HOME = f"/home/{USER}"


def node_exec(container: str, command: str, user: str | None = None) -> str:
    argv = ["podman", "exec", *(["--user", user] if user else []), container, "sh", "-c",
            command]
    return sh(*argv).stdout


def bench_sandbox(name: str, nodes: int, bastion: bool, torchrun: str | None = None,
                  slurm: bool = False, env_on_nodes: bool = False) -> dict:
    """A sandbox where `train` runs without site.yml, in a minute instead of a quarter of an
    hour: torch is installed once into a venv on the share (from the offline wheelhouse),
    every node's python_env.json points at it (TORCHRUN: a wrapper instead of the venv's
    torchrun), fingerprint.json is that venv's fingerprint as the python_env role writes
    it, and checkpoints/ is made as the nfs_server role makes it. The share is the
    sandbox's bind mount (a mount point, as its inventory allows). ENV_ON_NODES: the venv
    on each node's own disk instead (as the python_env role puts the cluster's: what a
    node reads from its environment then costs the share nothing), installed on every
    node at once, a few minutes more."""
    info = sandbox_up(name, nodes, bastion, slurm)
    try:
        _prepare(info, torchrun, LOCAL_VENV if env_on_nodes else VENV)
    except BaseException:
        sandbox_down(name)  # a failed set-up leaves no containers behind
        raise
    return info


def _prepare(info: dict, torchrun: str | None, venv: str = VENV) -> None:
    share = Path(info["share"])
    wheels = REPO / ".cache" / "wheelhouse"
    sh(sys.executable, "-m", "orchestrator", "wheelhouse", "--env", str(REPO / "environment.yml"),
       "--dest", str(wheels))
    sh("cp", "-al", str(wheels), str(share / "wheelhouse"))
    (share / "checkpoints").mkdir(mode=0o1777, exist_ok=True)
    (share / "checkpoints").chmod(0o1777)
    first = info["nodes"][0]["container"]
    install = (f"python3 -m venv {venv} && {venv}/bin/pip install -q --no-index "
               "--find-links /mnt/cluster/wheelhouse torch==2.13.0")
    with ThreadPoolExecutor() as pool:   # on the share: once; on the nodes: each at once
        list(pool.map(lambda n: node_exec(n["container"], install),
                      info["nodes"] if venv != VENV else info["nodes"][:1]))
    env = json.dumps({"backend": "venv", "prefix": venv, "python": f"{venv}/bin/python",
                      "torchrun": torchrun or f"{venv}/bin/torchrun"})
    sh("cp", str(REPO / "roles" / "python_env" / "files" / "fingerprint.py"),
       str(share / "bench-fingerprint.py"))
    for n in info["nodes"]:
        node_exec(n["container"], f"mkdir -p /etc/clustertrain && echo '{env}' > "
                                  "/etc/clustertrain/python_env.json")
    fp = node_exec(first, "python3 /mnt/cluster/bench-fingerprint.py --env "
                          "/etc/clustertrain/python_env.json").strip()
    for n in info["nodes"]:
        node_exec(n["container"], f"echo {shlex.quote(fp)} > /etc/clustertrain/fingerprint.json")


def write_results(out: str, what: str, machine: str, results: list, **extra: object) -> None:
    """The benchmark's results file: what was timed, on what machine (with the load average
    at the end: the machine is shared), when, and each row."""
    load = os.getloadavg()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({
        "what": what,
        "machine": f"{os.cpu_count()} cores, shared with other work (load average "
                   f"{load[0]:.1f} at the end); {machine}",
        **extra, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": results}, indent=2) + "\n")
