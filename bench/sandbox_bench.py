"""What the sandbox benchmarks share: the repository on sys.path, the environment podman
and Ansible need, a command runner that stops the benchmark on failure, sandbox up/down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def sandbox_up(name: str, nodes: int, bastion: bool = False) -> dict:
    """`sandbox up --json`: its nodes (name, address, container), inventory and share.
    With BASTION, the nodes are reachable only through a bastion (ProxyJump)."""
    return json.loads(sh(sys.executable, "-m", "orchestrator", "sandbox", "up", "--nodes",
                         str(nodes), "--name", name, "--json",
                         *(["--bastion"] if bastion else [])).stdout)


def sandbox_down(name: str) -> None:
    subprocess.run([sys.executable, "-m", "orchestrator", "sandbox", "down", "--name", name],
                   env=ENV, capture_output=True)
