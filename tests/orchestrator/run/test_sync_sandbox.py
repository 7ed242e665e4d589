"""Code sync into per-run snapshots, --dry-run and `preflight`, on the real sandbox nodes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cluster import ssh
from orchestrator.cluster.inventory import load_cluster
from orchestrator.run.sync import sync_code

from ...cluster import ENV as PODMAN_ENV, REPO, ProvisionedCluster as Sandbox

# The timeout covers the session fixture too: preparing nodes takes minutes on a busy machine.
pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1500)]


def test_snapshots_are_per_run_and_linked(sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "data").mkdir(parents=True)
    (code / "train.py").write_text("print('v1')\n")
    (code / "big.txt").write_text("unchanged\n" * 1000)
    (code / ".gitignore").write_text("*.ckpt\n")
    (code / "data" / "model.ckpt").write_text("not for the nodes")
    cluster = load_cluster(sandbox_cluster.inventory)
    sync_code(cluster, code, "orch-test-sync-1")
    (code / "train.py").write_text("print('v2')\n")  # edited locally after run 1 started
    second = sync_code(cluster, code, "orch-test-sync-2")
    for node in ("node0", "node1"):
        def sh(cmd: str, node: str = node) -> str:
            return sandbox_cluster.exec(node, "sh", "-c", cmd).stdout.strip()
        # The snapshots are the job user's, in its private state directory.
        root = "/home/alice/.clustertrain/code"
        assert sh(f"stat -c '%U %a' /home/alice/.clustertrain {root}").split() == [
            "alice", "700", "alice", "700"]
        assert sh(f"stat -c %U {root}/orch-test-sync-2/train.py") == "alice"
        assert sh(f"cat {root}/orch-test-sync-1/train.py") == "print('v1')"
        assert sh(f"cat {root}/orch-test-sync-2/train.py") == "print('v2')"
        # Unchanged files are hard links to the previous snapshot, not copies.
        assert sh(f"stat -c %i {root}/orch-test-sync-1/big.txt") == \
            sh(f"stat -c %i {root}/orch-test-sync-2/big.txt")
        assert sh(f"readlink -f {root}/latest") == f"{root}/orch-test-sync-2"
        assert sh(f"test -e {root}/orch-test-sync-2/data/model.ckpt && echo yes || echo no") == "no"
    assert second.seconds < 60


def test_unchanged_code_is_linked_without_a_playbook(sandbox_cluster: Sandbox,
                                                      tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('v1')\n")
    (code / "lib.py").write_text("X = 1\n")
    (code / "data.txt").write_text("a line of data\n" * 2000)
    (code / "keep.py").write_text("Y = 2\n")
    cluster = load_cluster(sandbox_cluster.inventory).select(nodes=2)
    clients = {n.name: ssh.connect(n.name, n.ssh) for n in cluster.nodes}
    root = "/home/alice/.clustertrain/code"
    run = f"orch-test-reuse-{os.getpid()}"   # a run id is never used twice on a cluster

    def sh(node: str, cmd: str) -> str:
        return sandbox_cluster.exec(node, "runuser", "-u", "alice", "--", "sh", "-c",
                                    cmd).stdout.strip()
    try:
        assert sync_code(cluster, code, f"{run}-1", clients=clients).reused == []
        second = sync_code(cluster, code, f"{run}-2", clients=clients)
        assert second.reused == ["node0", "node1"]
        for node in ("node0", "node1"):
            assert sh(node, f"cat {root}/{run}-2/train.py") == "print('v1')"
            assert sh(node, f"stat -c %i {root}/{run}-1/train.py") == \
                sh(node, f"stat -c %i {root}/{run}-2/train.py")
            assert sh(node, f"readlink {root}/latest") == f"{run}-2"
        # The job on node1 wrote into its working directory: node1 is synced again, and
        # what the job wrote is in the next run's working directory (carried: the
        # tutorial's snapshot.pt resumes); node0 is still linked.
        sh("node1", f"echo partial > {root}/{run}-2/out.txt")
        third = sync_code(cluster, code, f"{run}-3", clients=clients)
        assert (third.reused, third.delta) == (["node0"], ["node1"])
        assert sh("node1", f"ls {root}/{run}-3") == \
            "data.txt\nkeep.py\nlib.py\nout.txt\ntrain.py"
        assert third.carried["node1"].carried == ["out.txt"]
        assert third.carried["node0"].carried == []
        # Edited locally: only the edit is sent to every node, over its open connection
        # (the rest hard-linked to the latest snapshot), and the new code is what runs.
        # data.txt edited in part and lib.py touched (as a checkout does): most of each
        # is what the latest snapshot holds.
        (code / "train.py").write_text("print('v2')\n")
        with (code / "data.txt").open("a") as data:
            data.write("one more line\n")
        lib_ino = {n: sh(n, f"stat -c %i {root}/{run}-3/lib.py")
                   for n in ("node0", "node1")}
        os.utime(code / "lib.py")
        fourth = sync_code(cluster, code, f"{run}-4", clients=clients)
        assert (fourth.reused, fourth.delta) == ([], ["node0", "node1"])
        for node in ("node0", "node1"):
            assert sh(node, f"cat {root}/{run}-4/train.py") == "print('v2')"
            assert sh(node, f"md5sum < {root}/{run}-4/data.txt") == \
                sh(node, f"echo '{hashlib.md5((code / 'data.txt').read_bytes()).hexdigest()}  -'")
            assert sh(node, f"cat {root}/{run}-4/lib.py") == "X = 1"
            assert sh(node, f"stat -c %i {root}/{run}-4/lib.py") != lib_ino[node]
            assert sh(node, f"stat -c %i {root}/{run}-3/train.py") != \
                sh(node, f"stat -c %i {root}/{run}-4/train.py")
            assert sh(node, f"stat -c %i {root}/{run}-3/data.txt") != \
                sh(node, f"stat -c %i {root}/{run}-4/data.txt")
            assert sh(node, f"stat -c %i {root}/{run}-3/keep.py") == \
                sh(node, f"stat -c %i {root}/{run}-4/keep.py")
            assert sh(node, f"readlink {root}/latest") == f"{run}-4"
    finally:
        for client in clients.values():
            client.close()


def test_dry_run_prints_commands_and_starts_nothing(sandbox_cluster: Sandbox,
                                                    tmp_path: Path) -> None:
    jobs = Path(__file__).resolve().parents[1] / "jobs"
    p = subprocess.run([sys.executable, "-m", "orchestrator", "train", "-i",
                        str(sandbox_cluster.inventory), "--nodes", "2", "--workdir", str(jobs),
                        "--runs-dir", str(tmp_path / "runs"), "--env", "LR=0.5", "--dry-run",
                        "--doctor", "ddp_allreduce.py", "--", "--steps", "1"],
                       cwd=REPO, env=PODMAN_ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    addr0 = sandbox_cluster.nodes["node0"]  # the IP node0's name resolves to on the nodes
    for rank in (0, 1):
        assert (f"--nnodes 2 --node-rank {rank} --nproc-per-node 1 --master-addr {addr0} "
                "--master-port") in p.stdout
    assert "LR=0.5" in p.stdout and "ddp_allreduce.py --steps 1" in p.stdout
    assert "# dry run: `doctor` would run first on these nodes; it was not run" in p.stdout
    assert not (tmp_path / "runs").exists()   # no run at all: not the doctor's either
    assert "# node0 (alice@node0), node rank 0" in p.stdout
    run_id = p.stdout.split("/home/alice/.clustertrain/jobs/")[1].split("/")[0]
    for node in ("node0", "node1"):
        assert sandbox_cluster.exec(node, "test", "-e",
                                     f"/home/alice/.clustertrain/jobs/{run_id}",
                                     check=False).returncode != 0


def test_preflight_table(sandbox_cluster: Sandbox) -> None:
    p = subprocess.run([sys.executable, "-m", "orchestrator", "preflight", "-i",
                        str(sandbox_cluster.inventory), "--hosts", "node1,node0"],
                       cwd=REPO, env=PODMAN_ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = p.stdout.splitlines()
    assert rows[0].split()[:5] == ["NODE", "ADDRESS", "USER", "SSH", "TORCH"]
    # Inventory order decides node 0 (the master port is checked there), not --hosts order.
    # Addresses are the inventory's names, with the IP each resolves to on the nodes.
    for row, node in zip(rows[1:3], ("node0", "node1"), strict=True):
        assert row.split()[:5] == [node, f"{node}[{sandbox_cluster.nodes[node]}]", "alice",
                                   "ok", "2.13.0+cpu"]
    assert "29500" in rows[1] and "problem:" not in p.stdout
