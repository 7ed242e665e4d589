"""A secret passed to alice's ranks with `--secret-env` (an API token) reaches every rank
and nothing else: no process' command line on any node (which bob can read with ps), no
log, no file of the run's record, nothing on the share. Real torchrun on three
containers."""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from ..cluster import ENV, REPO, ProvisionedCluster
from ..orchestrator.run.test_supervision_sandbox import JOBS, NODES, left, text, wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]


def found_anywhere(cluster: ProvisionedCluster, value: str, runs: Path) -> list[str]:
    """Where VALUE can be read: every process' command line on every node, alice's files
    of the run on the nodes (logs, job directories) and on the share, the local runs
    directory."""
    where = []
    for node in NODES:
        argv = cluster.exec(node, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '",
                            check=False).stdout
        if value in argv:
            where.append(f"{node}: a command line")
        files = cluster.exec(node, "grep", "-rl", "--", value, "/home/alice/.clustertrain/jobs",
                             "/mnt/cluster/checkpoints/alice/.clustertrain", check=False)
        where += [f"{node}: {f}" for f in files.stdout.split()]
    where += [str(p) for p in runs.rglob("*") if p.is_file() and value in
              p.read_text(errors="replace")]
    return where


def test_a_secret_env_value_reaches_the_ranks_and_nothing_else(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    value = f"tok-{secrets.token_hex(12)}"
    digest = hashlib.sha256(value.encode()).hexdigest()[:16]
    tmp_path.mkdir(exist_ok=True)
    out = open(tmp_path / "train.out", "w")
    train = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "train", "-i", str(sandbox_cluster.inventory),
         "--runs-dir", str(tmp_path), "--workdir", str(JOBS), "--nodes", "3", "--share-gpus",
         "--secret-env", "HUB_TOKEN", "secret_env.py", "--", "HUB_TOKEN", "20"],
        cwd=REPO, env={**ENV, "HUB_TOKEN": value}, stdout=out, stderr=subprocess.STDOUT,
        text=True)
    try:
        wait_for(lambda: text(tmp_path).count(f"HUB_TOKEN digest {digest}") >= 3, 240,
                 "every rank to see the secret", train, tmp_path)
        assert set(left(sandbox_cluster, tmp_path)) == set(NODES)
        assert found_anywhere(sandbox_cluster, value, tmp_path) == []   # while it runs
        assert train.wait(timeout=120) == 0, text(tmp_path)[-3000:]
    finally:
        if train.poll() is None:
            train.kill()
    assert found_anywhere(sandbox_cluster, value, tmp_path) == []       # and after
    assert value not in text(tmp_path)
    assert os.environ.get("HUB_TOKEN") is None   # the test's own environment: untouched
