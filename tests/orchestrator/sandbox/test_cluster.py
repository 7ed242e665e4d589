"""A real sandbox: containers with systemd and sshd, reached over SSH like a real site's
servers: by name through an ssh_config, as a user with sudo (alice) or without (bob),
never as root, and in bastion mode only through the bastion."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import SandboxError
from orchestrator.sandbox import cluster
from orchestrator.sandbox.image import ensure_image
from orchestrator.sandbox.layout import LABEL, state_root
from orchestrator.sandbox.podman import podman, podman_json

# Sandboxes of their own: `make test` runs these beside the shared cluster's tests.
pytestmark = [pytest.mark.sandbox, pytest.mark.own_sandbox]
REPO = Path(__file__).resolve().parents[3]


ANSIBLE = str(Path(sys.executable).parent / "ansible")


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

    assert info["bastion"] is None
    assert set(info["users"]) == {"alice", "bob"}

    spec = cluster.load(name)
    for node in spec.members():  # real SSH login with the generated key, host key checked
        assert cluster.ssh_check(spec, node) == "running"

    ping = subprocess.run([ANSIBLE, "all", "-i", info["inventory"], "-m", "ansible.builtin.ping",
                           "-o"], cwd=REPO, capture_output=True, text=True, timeout=120)
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
    status = json.loads(cli("sandbox", "status", "--name", keep, "--json").stdout)
    assert status["nodes"][0]["state"] == "running"


def test_ansible_on_two_sandboxes_at_once_reaches_each_ones_own_nodes(sandbox_name):
    """Both sandboxes call their first node node0 and log in as alice. Ansible names its
    persistent SSH connections by (host, port, user), so without a control directory per
    sandbox a play on the second would run over the first one's live connection, on the
    first sandbox's machine (seen: site.yml armed its firewall rollback on the wrong node)."""
    a, b = sandbox_name(), sandbox_name()
    for name in (a, b):
        assert cli("sandbox", "up", "--nodes", "1", "--name", name).returncode == 0
    for name in (a, b, a):  # interleaved, within ControlPersist
        inventory = state_root() / name / "inventory.yml"
        seen = subprocess.run([ANSIBLE, "node0", "-i", str(inventory), "-m", "command", "-a",
                               "hostname -I", "-o"], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        assert seen.returncode == 0, seen.stdout + seen.stderr
        address = cluster.load(name).members()[0].address  # each sandbox has its own subnet
        assert seen.stdout.split("(stdout)")[1].split() == [address], (name, seen.stdout)


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


def ssh(info: dict, host: str, *command: str, user: str = "alice", **opts: str):
    """OpenSSH with the sandbox's ssh_config for USER, as a person would type it."""
    options = [a for k, v in {"BatchMode": "yes", "ConnectTimeout": "5", **opts}.items()
               for a in ("-o", f"{k}={v}")]
    return subprocess.run(["ssh", "-F", info["users"][user]["ssh_config"], *options, host,
                           *command],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_nodes_are_a_site_logins_by_name_sudo_for_alice_only_no_root(sandbox_name):
    name = sandbox_name()
    proc = cli("sandbox", "up", "--nodes", "2", "--name", name, "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    address = {n["name"]: n["address"] for n in info["nodes"]}

    # root is refused by sshd itself (root's authorized_keys holds the same key).
    root = ssh(info, "node0", "true", User="root")
    assert root.returncode == 255 and "Permission denied" in root.stderr, root.stderr
    sshd = ssh(info, "node0", "sudo", "-n", "sshd", "-T")
    assert "permitrootlogin no" in sshd.stdout.splitlines(), sshd.stdout + sshd.stderr

    for node in ("node0", "node1"):
        alice = ssh(info, node, "id -un; id -u; hostname; sudo -n id -un; stat -c %a ~ ~/.ssh")
        assert alice.returncode == 0, alice.stderr
        assert alice.stdout.split() == ["alice", "1001", node, "root", "700", "700"]

        bob = ssh(info, node, "id -un; id -u; sudo -n true", user="bob")
        assert bob.stdout.split() == ["bob", "1002"]
        assert bob.returncode != 0 and "password is required" in bob.stderr, bob.stderr

    # The nodes resolve each other by short name through the network's own DNS.
    for here, there in (("node0", "node1"), ("node1", "node0")):
        res = ssh(info, here, "getent", "hosts", there)
        assert res.returncode == 0 and res.stdout.split()[0] == address[there], \
            res.stdout + res.stderr

    # Both inventories log in as their user; alice's becomes root, bob's does not.
    for user, expected in (("alice", "root"), ("bob", "bob")):
        run = subprocess.run([ANSIBLE, "all", "-i", info["users"][user]["inventory"], "-m",
                              "ansible.builtin.command", "-a", "id -un", "-o"],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        assert [line.split()[-1] for line in run.stdout.splitlines()] == [expected] * 2, run.stdout


def test_bastion_is_the_only_way_in(sandbox_name):
    name = sandbox_name()
    start = time.monotonic()
    proc = cli("sandbox", "up", "--nodes", "2", "--bastion", "--name", name, "--json")
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert elapsed < 60, f"sandbox up --bastion took {elapsed:.1f} s"
    info = json.loads(proc.stdout)
    bastion = info["bastion"]
    assert bastion["name"] == "bastion" and bastion["container"] == f"{name}-bastion"
    assert bastion["state"] == "running"
    assert "bastion" not in [n["name"] for n in info["nodes"]]

    # Straight from this machine to a node: dropped by the node's own nftables table.
    direct = ssh(info, "node0", "true", ProxyJump="none", ConnectTimeout="3")
    assert direct.returncode == 255, direct.stdout + direct.stderr
    assert "timed out" in direct.stderr, direct.stderr
    # The bastion itself answers directly; through it, the node does.
    assert ssh(info, "bastion", "id", "-un").stdout.strip() == "alice"
    via = ssh(info, "node0", "echo $SSH_CLIENT; sudo -n nft list table inet sandbox_bastion")
    assert via.returncode == 0, via.stderr
    assert via.stdout.split()[0] == bastion["address"]
    assert f"ip saddr {info['gateway']} tcp dport 22" in via.stdout
    # The nodes still reach each other's sshd.
    peer = ssh(info, "node1", "timeout 3 bash -c '</dev/tcp/node0/22' && echo open")
    assert peer.stdout.strip() == "open", peer.stderr
    # The rule is in the nodes' network namespaces, not this machine's.
    if shutil.which("nft"):
        host = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
        assert "sandbox_bastion" not in host.stdout

    ping = subprocess.run([ANSIBLE, "all", "-i", info["inventory"], "-m", "ansible.builtin.ping",
                           "-o"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert ping.stdout.count("SUCCESS") == 2
