"""Preflight against the real 3-node sandbox: the shared path as it is (not mounted, an
empty stand-in, not writable by the job's user, another filesystem), node 0's master port
blocked by a firewall rule, and a wheel changed on the share after `wheelhouse`.

Each test changes node2 (or, for the firewall, adds a rule on node0 for ports nobody else
uses) and puts it back in its teardown. Mounts inside a node are changed from the host in
the node's mount namespace (nsenter): the node containers have no CAP_SYS_ADMIN."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from ...cluster import BIN, ENV, REPO, ProvisionedCluster

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1500)]
JOBS = Path(__file__).resolve().parents[1] / "jobs"
SHARED = "/mnt/cluster"
ASIDE = "/run/ct-share-aside"   # where a test keeps the share's mount while it is away


def playbook(*args: str) -> subprocess.CompletedProcess:
    """ansible-playbook with its own ControlPersist sockets: Ansible names them by host
    alias, port and user, so another sandbox's `node2` (same alias, same user) would
    otherwise be reached through a master connection it left open."""
    with tempfile.TemporaryDirectory(prefix="ct-cp-", dir="/tmp") as cp:
        return subprocess.run([str(BIN / "ansible-playbook"), *args], cwd=REPO,
                              env={**ENV, "ANSIBLE_SSH_CONTROL_PATH_DIR": cp},
                              capture_output=True, text=True, timeout=1800)


def preflight(sandbox: ProvisionedCluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", "preflight", "-i",
                           str(sandbox.inventory), "--nodes", "3", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=300)


def in_mount_ns(sandbox: ProvisionedCluster, node: str, script: str) -> None:
    pid = subprocess.run(["podman", "inspect", "-f", "{{.State.Pid}}",
                          sandbox.containers[node]], env=ENV, capture_output=True, text=True,
                         check=True).stdout.strip()
    subprocess.run(["nsenter", "-t", pid, "-m", "-p", "sh", "-ec", script], check=True,
                   capture_output=True, text=True, timeout=60)


def share_mount(sandbox: ProvisionedCluster, node: str) -> str:
    """What stands at NODE's /mnt/cluster: its file system's type and source."""
    return sandbox.exec(node, "findmnt", "-n", "-o", "FSTYPE,SOURCE", "--mountpoint", SHARED,
                        check=False).stdout.strip()


@contextmanager
def changed_mount(sandbox: ProvisionedCluster, node: str, change: str, undo: str):
    """NODE's share changed by CHANGE, then put back by UNDO as it was: the same mount (the
    node's FUSE passthrough, which the share-stall tests stop), not merely the same files."""
    before = share_mount(sandbox, node)
    in_mount_ns(sandbox, node, change)
    try:
        yield
    finally:
        in_mount_ns(sandbox, node, undo)
        after = share_mount(sandbox, node)
        assert after == before, f"{node}'s {SHARED} was not put back: {after!r}, was {before!r}"


CASES = {
    # the share is not mounted: the node's own empty directory is all there is
    # (the share's mount is kept aside, and bound back: the same FUSE mount as before)
    "not mounted": (f"mkdir -p {ASIDE} && mount --bind {SHARED} {ASIDE} && umount -l {SHARED}",
                    f"mount --bind {ASIDE} {SHARED} && umount {ASIDE}",
                    f"node2: shared path: {SHARED} is not a mount point (it is a directory of "
                    "/, overlay) and it is empty; mount the share there"),
    # an empty file system mounted in its place
    "empty stand-in": (f"mount -t tmpfs ct-empty {SHARED}", f"umount {SHARED}",
                       f"node2: shared path: {SHARED} is mounted (tmpfs, ct-empty) but empty: "
                       "not the cluster's share"),
    # checkpoints/ is not writable by the job's user (alice) on node2
    "not writable": (f"mount -t tmpfs -o mode=0755 ct-ro {SHARED}/checkpoints",
                     f"umount {SHARED}/checkpoints",
                     f"node2: shared path: {SHARED}/checkpoints is not writable by alice "
                     "(uid 1001): Permission denied"),
    # a file system that looks right but is not the one the other nodes share
    "another filesystem": (f"mount -t tmpfs ct-other {SHARED} && mkdir -m 1777 "
                           f"{SHARED}/checkpoints && touch {SHARED}/data",
                           f"umount {SHARED}",
                           f"node2: {SHARED} is not the same filesystem as on node0: a file "
                           f"node0 wrote to {SHARED}/checkpoints/ is not there"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_shared_path_problems_are_refused_naming_node_and_cause(
        sandbox_cluster: ProvisionedCluster, case: str) -> None:
    change, undo, expected = CASES[case]
    with changed_mount(sandbox_cluster, "node2", change, undo):
        p = preflight(sandbox_cluster)
    assert p.returncode != 0, p.stdout
    assert expected in p.stdout, p.stdout
    rows = {row.split()[0]: row.split() for row in p.stdout.splitlines()[1:4]}
    assert rows["node0"][8] == rows["node1"][8] == "ok", p.stdout
    assert "problem: node0" not in p.stdout and "problem: node1" not in p.stdout, p.stdout
    # And with the share back, preflight passes.
    ok = preflight(sandbox_cluster)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_blocked_master_port_is_refused_before_torchrun(sandbox_cluster: ProvisionedCluster,
                                                        tmp_path: Path) -> None:
    """A firewall rule on node0 (its own nft table) drops node2's connections to the master
    ports 29650-29699: train names the port and both nodes; no run is started."""
    table = f"ct_test_{secrets.token_hex(3)}"
    node2_ip = sandbox_cluster.nodes["node2"]
    sandbox_cluster.exec("node0", "sh", "-ec",
                         f"nft add table inet {table}; "
                         f"nft 'add chain inet {table} input {{ type filter hook input "
                         "priority -5 ; policy accept ; }'; "
                         f"nft add rule inet {table} input ip saddr {node2_ip} "
                         "tcp dport 29650-29699 drop")
    try:
        p = subprocess.run([sys.executable, "-m", "orchestrator", "train", "-i",
                            str(sandbox_cluster.inventory), "--nodes", "3", "--master-port",
                            "29650", "--runs-dir", str(tmp_path / "runs"), "--workdir",
                            str(JOBS), "ddp_allreduce.py"],
                           cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    finally:
        sandbox_cluster.exec("node0", "nft", "delete", "table", "inet", table)
    assert p.returncode != 0
    assert ("node2 cannot connect to node0's master port 29650 at "
            f"{sandbox_cluster.nodes['node0']}: no answer within 3 s (packets dropped: a "
            "firewall?); open TCP port 29650 on node0") in p.stderr, p.stdout + p.stderr
    assert "node1 cannot connect" not in p.stderr
    # Refused before anything started (other users' jobs may run on the nodes meanwhile).
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
    assert "syncing" not in p.stdout and "starting torchrun" not in p.stdout
    # The listener on node0 was stopped: the port is free again at once.
    free = sandbox_cluster.exec("node0", "python3", "-c",
                                "import socket; s = socket.socket(); s.setsockopt("
                                "socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                                "s.bind(('0.0.0.0', 29650))", check=False)
    assert free.returncode == 0, free.stderr


def test_a_wheel_changed_on_the_share_is_refused_by_name(sandbox_cluster: ProvisionedCluster
                                                         ) -> None:
    """A copy of the wheelhouse on the share with one wheel changed after `wheelhouse`
    wrote the lock: the python_env role refuses it, naming the wheel and both hashes. The
    role runs on node2 into a scratch environment, so node2's own stays as it is."""
    name = f"wheelhouse-ct-{secrets.token_hex(3)}"
    copy = sandbox_cluster.share / name
    shutil.copytree(sandbox_cluster.share / "wheelhouse", copy)  # a real copy, not links
    wheel = copy / "mpmath-1.3.0-py3-none-any.whl"
    original = hashlib.sha256(wheel.read_bytes()).hexdigest()
    with open(wheel, "ab") as fh:
        fh.write(b"changed on the share")
    changed = hashlib.sha256(wheel.read_bytes()).hexdigest()
    scratch = f"/tmp/{name}"
    try:
        p = playbook("playbooks/python_env.yml", "-i", str(sandbox_cluster.inventory),
                     "--limit", "node2",
                "-e", f"python_env_wheelhouse={SHARED}/{name}",
                     "-e", f"python_env_home={scratch}",
                     "-e", f"python_env_state_dir={scratch}/state")
    finally:
        shutil.rmtree(copy, ignore_errors=True)
        sandbox_cluster.exec("node2", "rm", "-rf", scratch, check=False)
    said = re.sub(r"\s+", " ", p.stdout)
    assert p.returncode != 0, p.stdout[-3000:]
    assert (f"does not match its lock on node2: mpmath-1.3.0-py3-none-any.whl (mpmath==1.3.0): "
            f"expected sha256 {original}, got {changed}") in said, p.stdout[-3000:]
    assert "Nothing was installed from it" in said


def test_a_node_whose_temporary_directory_is_nearly_full_is_refused_then_warned_about(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """node2's /tmp replaced by a 64 MiB filesystem with 62 MiB written: below the 2 GiB a
    run needs (the default), preflight refuses naming node2's /tmp; with the inventory's
    cluster_min_free_gb lowered to 1 MiB, the run may start and the nearly full /tmp is a
    warning. The share and the other nodes are named in neither."""
    lowered = tmp_path / "inventory.yml"
    lowered.write_text(sandbox_cluster.inventory.read_text().replace(
        "\n  vars:\n", "\n  vars:\n    cluster_min_free_gb: 0.001\n", 1))
    with changed_mount(sandbox_cluster, "node2",
                       "mount -t tmpfs -o size=64m,mode=1777 ct-small /tmp && "
                       "head -c 62M /dev/zero > /tmp/filler", "umount /tmp"):
        refused = preflight(sandbox_cluster)
        warned = subprocess.run([sys.executable, "-m", "orchestrator", "preflight", "-i",
                                 str(lowered), "--nodes", "3"], cwd=REPO, env=ENV,
                                capture_output=True, text=True, timeout=300)
        filled = subprocess.run([sys.executable, "-m", "orchestrator", "train", "-i",
                                 str(lowered), "--nodes", "3", "--runs-dir",
                                 str(tmp_path / "runs"), "--workdir", str(JOBS),
                                 "fail_on_node.py", "--", "--fail-node", "2", "--how", "fill",
                                 "--after", "0"], cwd=REPO, env=ENV,
                                capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0, refused.stdout
    [problem] = [line for line in refused.stdout.splitlines() if line.startswith("problem:")]
    assert problem == ("problem: node2: /tmp has 2 MiB free of 64 MiB, below the 2 GiB a run "
                       "needs there (cluster_min_free_gb): free some (temporary files) or "
                       "lower cluster_min_free_gb in the inventory"), refused.stdout
    assert warned.returncode == 0, warned.stdout + warned.stderr
    assert "warning: node2: /tmp is nearly full: 2 MiB free of 64 MiB (temporary files)" \
        in warned.stdout, warned.stdout
    assert "problem:" not in warned.stdout and "/mnt/cluster" not in warned.stdout
    # A job that fills it: the run's error and its record say which disk, with its figures.
    assert filled.returncode != 0, filled.stdout[-3000:]
    said = re.search(r"run (\S+) failed: node2 exited with code 1 \(rank 2 exited with code 1\) "
                     r"first; the other nodes were stopped\. It ran out of space \(its ranks "
                     r"said a disk was full\): on node2, /tmp \(temporary files\) has (\d+) "
                     r"(KiB|MiB) free of 64 MiB; free some there, or write elsewhere\.",
                     filled.stderr)
    assert said, filled.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / said[1] / "summary.json").read_text())
    assert summary["no_space"]["node2"].startswith("/tmp (temporary files) has "), summary


EXPORT = "/srv/nfs/cluster"   # node0 serves the share from there (the nfs_server group)
HEALTH_TIMER = "clustertrain-health.timer"


@contextmanager
def small_share(sandbox: ProvisionedCluster, mib: int):
    """The share replaced by a MIB MiB filesystem, with the same directories (owners and
    modes) two levels down, on every node: a tmpfs mounted on the host over the directory
    every node's FUSE passthrough serves. node0 exports the share from a bind of that
    directory made when it started, which a host mount does not reach: its export is
    bound to its own view of the share meanwhile, so that its health check counts the
    small share's users. The health timers are paused (a check would cordon the nodes
    while the share is nearly full); afterwards each node's check runs once, lifting what
    it cordoned and drained, and the timers start again."""
    share = sandbox.share
    dirs = [(d, d.stat()) for d in sorted(share.glob("*/")) + sorted(share.glob("*/*/"))
            if d.is_dir() and not d.is_symlink()]
    for node in sandbox.nodes:
        sandbox.exec(node, "systemctl", "stop", HEALTH_TIMER)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0755", "ct-small-share",
                    str(share)], check=True, capture_output=True, timeout=60)
    try:
        for d, st in dirs:
            d.mkdir()
            os.chown(d, st.st_uid, st.st_gid)
            d.chmod(stat.S_IMODE(st.st_mode))
        in_mount_ns(sandbox, "node0", f"mount --bind {SHARED} {EXPORT}")
        yield
    finally:
        in_mount_ns(sandbox, "node0", f"umount {EXPORT} || true")
        subprocess.run(["umount", "-l", str(share)], check=True, capture_output=True,
                       timeout=60)
        for node in sandbox.nodes:
            sandbox.exec(node, "systemctl", "start", "clustertrain-health", check=False)
            sandbox.exec(node, "systemctl", "start", HEALTH_TIMER)


def check_health(sandbox: ProvisionedCluster, node: str) -> None:
    sandbox.exec(node, "systemctl", "start", "clustertrain-health")


def test_a_nearly_full_share_is_refused_naming_its_biggest_users_and_a_job_that_fills_it(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """A 64 MiB share, 24 MiB of it alice's and 8 MiB bob's: node0's health check (it
    serves the share) counts them, and cordons node0 for it. alice's job on node1 then
    fills the share with a 48 MiB checkpoint: its run fails naming the share as out of
    space; the next check counts again (in place: the share has no room for a new file),
    and preflight refuses the next run naming the share, alice first with her job's part,
    then bob."""
    lowered = tmp_path / "inventory.yml"   # the job may start on a 64 MiB share
    lowered.write_text(sandbox_cluster.inventory.read_text().replace(
        "\n  vars:\n", "\n  vars:\n    cluster_min_free_gb: 0.001\n", 1))
    users = sandbox_cluster.share / "health" / "users.json"
    with small_share(sandbox_cluster, 64):
        for user, mib in (("alice", 24), ("bob", 8)):
            sandbox_cluster.exec("node1", "runuser", "-u", user, "--", "sh", "-ec",
                                 f"head -c {mib}M /dev/zero > {SHARED}/checkpoints/{user}/old")
        check_health(sandbox_cluster, "node0")
        first = json.loads(users.read_text())
        filled = subprocess.run([sys.executable, "-m", "orchestrator", "train", "-i",
                                 str(lowered), "--hosts", "node1", "--runs-dir",
                                 str(tmp_path / "runs"), "--workdir", str(JOBS),
                                 "fail_on_node.py", "--", "--fail-node", "0", "--how", "fill",
                                 "--after", "0", "--fill-dir", f"{SHARED}/checkpoints/alice",
                                 "--fill-mib", "48"], cwd=REPO, env=ENV,
                                capture_output=True, text=True, timeout=300)
        check_health(sandbox_cluster, "node0")
        second = json.loads(users.read_text())
        refused = preflight(sandbox_cluster)
    mib = 1 << 20
    assert 24 * mib <= first["users"]["alice"] < 25 * mib, first
    assert 8 * mib <= first["users"]["bob"] < 9 * mib, first
    assert filled.returncode != 0, filled.stdout[-3000:]
    said = re.search(r"run (\S+) failed: .* It ran out of space \(its ranks said a disk was "
                     r"full\): on node1, /mnt/cluster \(the share\) has (\d+) KiB free of "
                     r"64 MiB; free some there, or write elsewhere\.", filled.stderr)
    assert said, filled.stderr[-3000:]
    assert second["time"] > first["time"] and second["free"] < mib, second
    assert list(second["users"])[:2] == ["alice", "bob"], second
    assert second["users"]["alice"] > 50 * mib, second   # hers and her job's part
    share_lines = [line for line in refused.stdout.splitlines()
                   if line.startswith(f"problem: the share {SHARED}")]
    assert refused.returncode != 0 and share_lines, refused.stdout
    assert re.fullmatch(
        r"problem: the share /mnt/cluster has \d+ KiB free of 64 MiB, below the 2 GiB a run "
        r"needs there \(cluster_min_free_gb\): free some \(checkpoints, datasets, the runs' "
        r"snapshots; its biggest users \d+ s ago: alice \d\d MiB, bob 8 MiB, .*; "
        r"`clustertrain du` shows what\) or lower cluster_min_free_gb in the inventory",
        share_lines[0]), share_lines
    # Said once: not again as each node's failed write to it ("shared path: ... No space").
    assert len(share_lines) == 1 and "shared path" not in refused.stdout, refused.stdout
    assert not users.exists()   # the share has room again: the count is gone
