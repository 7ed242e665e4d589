"""bob against the places of other users, on the real-site sandbox: the directory he makes
on the share in a new user's name before her first run is refused by her preflight,
naming him; his junk in node 0's master-port claims leaves alice a port; and the NFS
server (nfs-ganesha on the nfs_server host) refuses his requests, which come from an
unprivileged source port, whatever uid they state, while root on a member is served.
The rules: orchestrator/node/preflight.py (not_own, live_claims) and the nfs_server role."""

from __future__ import annotations

import base64
import json
import re
import secrets
import shutil
import subprocess

import pytest
import yaml

from orchestrator.cluster import nodelib
from orchestrator.defaults import RENDEZVOUS_SPAN as PORT_RANGE
from orchestrator.node import requests as rq
from orchestrator.node.protocol import PORT_CLAIMS_DIR
from orchestrator.sandbox.layout import EXPORT_PATH, SHARED_PATH

from ..cluster import ENV, ProvisionedCluster, orchestrator
from .conftest import as_user

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(300)]
PYTHON = "/usr/bin/python3"   # the node's system python: the one preflight's probe runs


def node_probe(cluster: ProvisionedCluster, user: str) -> dict:
    """What preflight's round 1 finds on node0 for USER: the node package as preflight
    ships it (into USER's home), and its `probe` verb run as USER."""
    def run(script: str, stdin: str) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", "exec", "-i", cluster.containers["node0"], "runuser",
                               "-l", user, "-c", script], input=stdin, env=ENV,
                              capture_output=True, text=True, timeout=120)
    installed = run(nodelib.install_command(), base64.b64encode(nodelib.bundle().tar_gz)
                    .decode())
    assert installed.returncode == 0, installed.stderr
    request: dict[str, object] = {"shared": {"path": SHARED_PATH, "fstypes": None},
                                  "addresses": [], "port": None, "run": None,
                                  "state_dir": None, "node": "node0"}
    done = run(nodelib.command(PYTHON, rq.Probe()), json.dumps(request))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_directory_bob_made_in_a_new_users_name_is_refused_naming_him(
        sandbox_cluster: ProvisionedCluster) -> None:
    """carol joins the site; before her first run bob makes checkpoints/carol, open to
    all. Her preflight refuses it, naming bob and the way out, and writes nothing there;
    once an admin removed it, her preflight makes it hers, private."""
    carol = f"carol{secrets.token_hex(3)}"
    squatted = sandbox_cluster.share / "checkpoints" / carol
    sandbox_cluster.exec("node0", "useradd", "-m", "-U", "-s", "/bin/bash", carol)
    try:
        made = as_user(sandbox_cluster, "node0", "bob",
                       f"mkdir -m 777 {SHARED_PATH}/checkpoints/{carol}")
        assert made.returncode == 0, made.stderr
        shared = node_probe(sandbox_cluster, carol)["shared"]
        mine = f"{SHARED_PATH}/checkpoints/{carol}"
        assert (shared["ok"], shared["kind"]) == (False, "not_own"), shared
        assert shared["error"].startswith(f"{mine} belongs to bob, not to {carol}")
        assert shared["fix"].startswith(f"ask bob or an admin to remove it (sudo rm -rf {mine})")
        assert list(squatted.iterdir()) == []
        shutil.rmtree(squatted)   # what the admin does
        shared = node_probe(sandbox_cluster, carol)["shared"]
        assert shared["ok"] is True, shared
        uid = int(sandbox_cluster.exec("node0", "id", "-u", carol).stdout)
        assert (squatted.stat().st_uid, squatted.stat().st_mode & 0o777) == (uid, 0o700)
    finally:
        shutil.rmtree(squatted, ignore_errors=True)
        sandbox_cluster.exec("node0", "userdel", "-r", carol, check=False)


def test_bobs_junk_claims_leave_alice_a_master_port(
        sandbox_cluster: ProvisionedCluster) -> None:
    """bob fills node0's master-port claims with a claim of every port of the range, in
    his name and in alice's: alice's preflight still finds a port (his claims hold a few
    at most), where it said "no free port in 29500-29699"."""
    junk = [f"{p}.{who}.junk{secrets.token_hex(2)}" for p in range(29500, 29500 + PORT_RANGE)
            for who in ("bob", "alice")]
    sandbox_cluster.exec("node0", "sh", "-c", f"[ -d {PORT_CLAIMS_DIR} ] || install -d "
                         f"-m 1777 {PORT_CLAIMS_DIR}")
    try:
        filled = as_user(sandbox_cluster, "node0", "bob",
                         f"cd {PORT_CLAIMS_DIR} && touch {' '.join(junk)}")
        assert filled.returncode == 0, filled.stderr
        done = orchestrator("preflight", "-i", str(sandbox_cluster.inventories["alice"]),
                            "--nodes", "3", "--share-gpus", timeout=300)
        said = done.stdout + done.stderr
        assert "no free port" not in said, said
        # Whatever else other tests left on the shared nodes, node0's port is found.
        port = re.search(r"^node0\s.*\s(\d{5})\s+\S+s$", said, re.MULTILINE)
        assert port and 29500 <= int(port.group(1)) < 29500 + PORT_RANGE, said
    finally:
        sandbox_cluster.exec("node0", "sh", "-c", f"cd {PORT_CLAIMS_DIR} && rm -f "
                             f"{' '.join(junk)}", check=False)


def test_the_nfs_server_refuses_bobs_unprivileged_port_and_serves_root(
        sandbox_cluster: ProvisionedCluster) -> None:
    """From a member, bob's libnfs client (his own, an unprivileged source port) states
    alice's uid to list, read and write her checkpoints: refused. Root on that member
    (a privileged port, squashed to the anonymous user) is served the same export."""
    inventory = yaml.safe_load(sandbox_cluster.inventory.read_text())
    server = next(iter(inventory["all"]["children"]["cluster"]["children"]["nfs_server"]
                       ["hosts"]))
    base = f"nfs://{server}{EXPORT_PATH}/checkpoints"
    planted = sandbox_cluster.share / "checkpoints" / "alice" / f"by-bob-{secrets.token_hex(3)}"
    try:
        bob = as_user(sandbox_cluster, "node1", "bob",
                      f"nfs-ls '{base}/alice?version=4&uid=1001&gid=1001'; echo rc=$?; "
                      f"echo x > /tmp/{planted.name}; nfs-cp /tmp/{planted.name} "
                      f"'{base}/alice/{planted.name}?version=4&uid=1001&gid=1001'; echo rc=$?;"
                      f" rm -f /tmp/{planted.name}")
        assert len(re.findall(r"rc=\d+", bob.stdout)) == 2, bob.stdout + bob.stderr
        assert "rc=0" not in bob.stdout and ".clustertrain" not in bob.stdout, bob.stdout
        assert not planted.exists()
    finally:
        planted.unlink(missing_ok=True)
    root = sandbox_cluster.exec("node1", "nfs-ls", f"{base}?version=4", check=False)
    assert root.returncode == 0 and re.search(r"\balice\b", root.stdout), root.stdout + root.stderr
