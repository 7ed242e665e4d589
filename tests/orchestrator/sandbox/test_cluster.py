"""A real sandbox: containers with systemd and sshd, reached over SSH like servers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import SandboxError
from orchestrator.podman import podman, podman_json
from orchestrator.sandbox import cluster
from orchestrator.sandbox.image import ensure_image
from orchestrator.sandbox.spec import LABEL, state_root

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[3]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def leftovers(name: str) -> list[str]:
    found = [c["Names"][0] for c in podman_json(
        ["ps", "-a", "--filter", f"label={LABEL}={name}", "--format", "json"])]
    if podman(["network", "exists", name], check=False).returncode == 0:
        found.append("network")
    if (state_root() / name).exists():
        found.append("state dir")
    return found


def test_three_nodes_answer_over_ssh_and_ansible(sandbox_name):
    ensure_image(state_root().parent / "images", log=lambda *_: None)  # cached image
    name = sandbox_name()
    start = time.monotonic()
    proc = cli("sandbox", "up", "--nodes", "3", "--name", name, "--json")
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    # Acceptance: with a cached image, three nodes are up, reachable and booted within 60 s.
    assert elapsed < 60, f"sandbox up took {elapsed:.1f} s"
    assert [n["name"] for n in info["nodes"]] == ["node0", "node1", "node2"]
    assert len({n["address"] for n in info["nodes"]}) == 3
    assert all(n["state"] == "running" for n in info["nodes"])

    spec = cluster.load(name)
    for node in spec.members():  # real SSH login with the generated key, host key checked
        assert cluster.ssh_check(spec, node) == "running"

    ping = subprocess.run([str(Path(sys.executable).parent / "ansible"), "all", "-i",
                           info["inventory"], "-m", "ansible.builtin.ping", "-o"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert ping.stdout.count("SUCCESS") == 3

    status = json.loads(cli("sandbox", "status", "--name", name, "--json").stdout)
    assert status == info


def test_down_removes_exactly_its_own_sandbox(sandbox_name):
    keep, gone = sandbox_name(), sandbox_name()
    assert cli("sandbox", "up", "--nodes", "1", "--name", keep).returncode == 0
    proc = cli("sandbox", "up", "--nodes", "2", "--outsiders", "1", "--name", gone)
    assert proc.returncode == 0, proc.stderr
    key = state_root() / gone / "id_ed25519"
    assert key.exists()

    proc = cli("sandbox", "down", "--name", gone)
    assert proc.returncode == 0, proc.stderr
    assert leftovers(gone) == []
    assert not key.exists()

    kept = cluster.load(keep)
    assert cluster.ssh_check(kept, kept.members()[0]) == "running"
    assert json.loads(cli("sandbox", "status", "--name", keep, "--json").stdout)["nodes"][0]["state"] == "running"


def test_name_in_use_is_refused_and_the_existing_sandbox_kept(sandbox_name):
    name = sandbox_name()
    assert cli("sandbox", "up", "--nodes", "1", "--name", name).returncode == 0
    proc = cli("sandbox", "up", "--nodes", "1", "--name", name)
    assert proc.returncode == 2
    assert f"sandbox name '{name}' is already in use" in proc.stderr
    assert f"sandbox down --name {name}" in proc.stderr
    spec = cluster.load(name)
    assert cluster.ssh_check(spec, spec.members()[0]) == "running"


def test_status_of_unknown_sandbox_says_how_to_create_it():
    proc = cli("sandbox", "status", "--name", "no-such-sandbox")
    assert proc.returncode == 2
    assert "sandbox up --name no-such-sandbox" in proc.stderr


def test_down_leaves_foreign_network_of_same_name_alone(sandbox_name):
    name = sandbox_name()
    podman(["network", "create", name])  # not made by a sandbox: no label
    try:
        with pytest.raises(SandboxError, match="left alone"):
            cluster.down(name, log=lambda *_: None)
        assert podman(["network", "exists", name], check=False).returncode == 0
    finally:
        podman(["network", "rm", name], check=False)
