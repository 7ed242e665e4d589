"""A sandbox cluster provisioned by the real site.yml, as the tests see it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / "sandbox" / "containers.conf"),
       "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PYTHONUNBUFFERED": "1"}
# What the python_env role installs: the link to its current state's interpreter (runs use
# the state's own path, under NODE_ENV_HOME/envs/, and keep it while they run).
NODE_PYTHON = "/opt/clustertrain/venv/bin/python"
NODE_ENV_HOME = "/opt/clustertrain/"


@dataclass(frozen=True)
class ProvisionedCluster:
    """A real site in miniature: nodes reached only through a bastion, by name, as the
    login user alice (sudo, provisions with become); bob is a second user without sudo."""

    name: str
    inventory: Path             # alice's
    share: Path                 # host directory mounted at /mnt/cluster on every node
    nodes: dict[str, str]       # inventory name -> address
    containers: dict[str, str]  # inventory name -> podman container (outsiders' too)
    inventories: dict[str, Path]  # login user -> that user's inventory
    user: str = "alice"

    def checkpoints(self, run_name: str, user: str | None = None) -> Path:
        """Where the training job keeps RUN_NAME's checkpoints for USER (on the share)."""
        return self.share / "checkpoints" / (user or self.user) / run_name

    def exec(self, node: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", "exec", self.containers[node], *argv], env=ENV,
                              capture_output=True, text=True, check=check, timeout=120)

    def job_processes(self, node: str) -> list[str]:
        """torchrun and its workers on NODE, found the way a user would: with ps."""
        out = self.exec(node, "ps", "-eo", "pid,args", "--no-headers").stdout
        return [line.strip() for line in out.splitlines()
                if "torchrun" in line or NODE_ENV_HOME in line]

    def run_processes(self, node: str, run_id: str, user: str | None = None) -> list[str]:
        """The pids on NODE of every live process of run RUN_ID (supervisor, torchrun,
        workers: each carries the run's id in its environment); other runs do not count.
        Read as the run's USER: root in the container may not read another's environ, and
        a zombie's environment reads empty."""
        return self.exec(node, "runuser", "-u", user or self.user, "--", "sh", "-c",
                         f"grep -l -a -x -z CLUSTERTRAIN_RUN_ID={run_id} "
                         "/proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3",
                         check=False).stdout.split()

    def kill(self, node: str) -> None:
        """Kill NODE's container outright, as a power cut would."""
        subprocess.run(["podman", "kill", self.containers[node]], env=ENV, check=True,
                       capture_output=True, timeout=60)

    def stall_share(self, seconds: float, nodes: list[str] | None = None) -> None:
        """Every access to the share blocks on NODES (all by default) for SECONDS, as on
        an NFS mount whose server stalls (`sandbox share-stall`)."""
        from orchestrator.sandbox import cluster, share

        share.stall(cluster.load(self.name), seconds, nodes)

    def start(self, node: str, timeout: float = 90) -> None:
        """Start NODE's container again and wait until its SSH answers (same address)."""
        from orchestrator.cluster import ssh
        from orchestrator.cluster.inventory import load_cluster

        subprocess.run(["podman", "start", self.containers[node]], env=ENV, check=False,
                       capture_output=True, timeout=60)
        spec = next(n for n in load_cluster(self.inventory).nodes if n.name == node)
        ssh.wait_until_it_answers(spec.name, spec.ssh, timeout)


def run(*argv: str, timeout: int = 1800, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("env", ENV)
    return subprocess.run(list(argv), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, **kw)


def orchestrator(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "orchestrator", *args, timeout=timeout)


def play_recap(stdout: str) -> dict[str, dict[str, int]]:
    """ansible-playbook's PLAY RECAP: {host: {"ok": n, "changed": n, "failed": n, ...}}."""
    recap = stdout[stdout.rindex("PLAY RECAP"):] if "PLAY RECAP" in stdout else ""
    return {host: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", rest)}
            for host, rest in re.findall(r"^(\S+)\s+: (ok=.*)$", recap, re.MULTILINE)}


def wait_for(predicate: Callable[[], object], timeout: float,
             what: str | Callable[[], str]) -> None:
    """Until PREDICATE holds; AssertionError naming WHAT (or what it returns then) after
    TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            said = what if isinstance(what, str) else what()
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {said}")
        time.sleep(0.5)
