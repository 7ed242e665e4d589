"""bob against alice's preflight, on the real-site sandbox: the listener alice's preflight
starts on node 0's master port answers anyone who connects, so bob reads its greeting and
answers with what it said (`stop NONCE` ended it, and every launch of hers was refused,
blaming her share and firewall); and node 0's master-port claims live in a directory of
root's that bob can neither make first nor deny alice in. The rules: orchestrator/node/
probe.py (serve, claims_dir) and the common role's tasks/ports.yml."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from orchestrator.node.protocol import PORT_CLAIMS_DIR

from ..cluster import ENV, ProvisionedCluster, orchestrator
from .conftest import as_user

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]
PORTS = range(29500, 29520)   # where alice's preflight listens (the inventory's port and up)

# bob's program on node 0: for SECONDS, connect to every port of PORTS again and again; a
# listener that greets like clustertrain's is answered `stop` and `ok` with what it said.
BOB = textwrap.dedent("""
    import socket, sys, time
    low, high, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    end = time.time() + seconds
    while time.time() < end:
        for port in range(low, high):
            for word in ("stop", "ok"):
                try:
                    c = socket.create_connection(("127.0.0.1", port), timeout=0.5)
                    said = c.recv(128).decode(errors="replace").split()
                    if said[:1] == ["clustertrain"]:
                        c.sendall((word + " " + " ".join(said[1:]) + "\\n").encode())
                        print("answered", port, word, flush=True)
                    c.close()
                except OSError:
                    pass
        time.sleep(0.01)
""")


def bob_answers(cluster: ProvisionedCluster, seconds: int) -> subprocess.Popen:
    """bob's program on node0, started (his own process, as runuser starts it)."""
    return subprocess.Popen(
        ["podman", "exec", "-i", cluster.containers["node0"], "runuser", "-l", "bob", "-c",
         f"python3 - {PORTS.start} {PORTS.stop} {seconds}"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def test_bob_who_reads_alices_listener_cannot_stop_it_nor_count_for_her_nodes(
        sandbox_cluster: ProvisionedCluster) -> None:
    """While bob answers every clustertrain listener on node0 with what it said, alice's
    preflight of three nodes passes, every time: nothing blames her share or firewall;
    where he got an answer in, it names someone who could not prove the run's key."""
    bob = bob_answers(sandbox_cluster, 240)
    try:
        assert bob.stdin is not None
        bob.stdin.write(BOB)
        bob.stdin.close()
        time.sleep(2)   # bob is connecting
        for _ in range(3):
            done = orchestrator("preflight", "-i", str(sandbox_cluster.inventories["alice"]),
                                "--nodes", "3", "--share-gpus", timeout=300)
            said = done.stdout + done.stderr
            assert done.returncode == 0, said
            assert "firewall" not in said and "not the same filesystem" not in said, said
    finally:
        # bob's program inside node0 (ending podman exec leaves it running), then the exec
        as_user(sandbox_cluster, "node0", "bob", "pkill -u bob -f '^python3 - '")
        bob.kill()
        bob.wait(timeout=60)
    out = bob.stdout.read() if bob.stdout else ""
    answered = [line for line in out.splitlines() if line.startswith("answered")]
    print(f"bob answered {len(answered)} times", file=sys.stderr)
    assert answered, "bob never reached alice's listener: the attack did not take place"


def test_the_port_claims_directory_is_roots_and_bob_can_neither_make_nor_deny_it(
        sandbox_cluster: ProvisionedCluster) -> None:
    """site.yml's common role made it at boot (tmpfiles.d), root's, like /tmp: bob cannot
    make it first, nor put an ACL on it that denies alice."""
    shown = sandbox_cluster.exec("node0", "stat", "-c", "%U %a %F", PORT_CLAIMS_DIR)
    assert shown.stdout.split() == ["root", "1777", "directory"], shown.stdout
    entry = sandbox_cluster.exec("node0", "cat", "/etc/tmpfiles.d/clustertrain-ports.conf")
    assert f"d {PORT_CLAIMS_DIR} 1777 root root -" in entry.stdout, entry.stdout
    acl = as_user(sandbox_cluster, "node0", "bob", (
        "python3 -c \"import os, pwd, struct; uid = pwd.getpwnam('alice').pw_uid; "
        "e = [(1, 7, 2**32 - 1), (2, 0, uid), (4, 7, 2**32 - 1), (16, 7, 2**32 - 1), "
        "(32, 7, 2**32 - 1)]; os.setxattr('" + PORT_CLAIMS_DIR + "', "
        "'system.posix_acl_access', struct.pack('<I', 2) + b''.join(struct.pack('<HHI', *x) "
        "for x in e))\""))
    assert acl.returncode != 0 and "Operation not permitted" in acl.stderr, acl.stderr
    made = as_user(sandbox_cluster, "node0", "bob",
                   "mkdir /run/clustertrain-ports-bob 2>&1 || echo refused")
    assert "refused" in made.stdout, made.stdout   # /run: only root makes directories there
    done = orchestrator("preflight", "-i", str(sandbox_cluster.inventories["alice"]),
                        "--nodes", "3", "--share-gpus", timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 0 and "cannot claim their master port" not in said, said
