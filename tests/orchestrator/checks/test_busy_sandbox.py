"""No scheduler: preflight sees the nodes another user's run uses. alice starts a detached
run on the three sandbox nodes (CPU nodes: the run is found by its supervisors'
processes); bob's run on the same nodes is refused, naming alice and her run, and runs
beside it with --share-gpus. Real SSH through the bastion, real users, real torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ...cluster import ENV, REPO, ProvisionedCluster

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1200)]
JOBS = Path(__file__).resolve().parents[1] / "jobs"
NODES = ("node0", "node1", "node2")
# Binds PORT as torch's TCPStore does (exit 0: nothing listens there).
BIND = ("import socket; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', {port}))")


def train(inventory: Path, runs: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", "train", "-i", str(inventory),
                           "--runs-dir", str(runs), "--workdir", str(JOBS), "--nodes", "3",
                           *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=600)


def test_a_run_on_nodes_another_users_run_uses_is_refused_naming_it(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    alice_runs, bob_runs = tmp_path / "alice", tmp_path / "bob"
    bob_inv = sandbox_cluster.inventories["bob"]
    started = train(sandbox_cluster.inventory, alice_runs, "--detach", "ddp_allreduce.py",
                    "--", "--steps", "2", "--sleep", "600")
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr
    (run,) = [d.name for d in alice_runs.iterdir() if (d / "run.json").exists()]
    try:
        # Once her torchrun holds its master port: `train --detach` gives up the port's
        # claim as it returns, before torchrun listens, and a launch in between would
        # pick the same port (not what is tested here).
        port = json.loads((alice_runs / run / "run.json").read_text())["master"]["port"]
        deadline = time.monotonic() + 120
        while (bound := sandbox_cluster.exec("node0", "python3", "-c", BIND.format(port=port),
                                             check=False)).returncode == 0:
            assert time.monotonic() < deadline, f"alice's torchrun never listened on {port}"
            time.sleep(1)
        assert "Address already in use" in bound.stderr, bound.stderr
        refused = train(bob_inv, bob_runs, "ddp_allreduce.py")
        said = refused.stdout + refused.stderr
        assert refused.returncode != 0, said[-3000:]
        for node in NODES:
            assert (f"{node} is in use by alice's run {run}. Wait for it to end or have it "
                    "stopped") in said, said[-3000:]
        assert "or pass --share-gpus to run beside it" in said
        assert "nothing was started" in refused.stderr
        assert not list(bob_runs.glob("*/run.json")), "a refused run left a record"
        # Knowingly beside it: a warning, and bob's run runs to its end.
        beside = train(bob_inv, bob_runs, "--share-gpus", "ddp_allreduce.py")
        said = beside.stdout + beside.stderr
        assert beside.returncode == 0, said[-3000:]
        assert (f"warning: node0 is in use by alice's run {run}; running beside it "
                "(--share-gpus)") in beside.stdout, said[-3000:]
        for rank, node in enumerate(NODES):
            assert f"{node}/rank{rank} | rank {rank}/3 host {node} sum 6 ok" in beside.stdout
        # alice's run was not touched.
        assert all(sandbox_cluster.run_processes(n, run) for n in NODES)
    finally:
        stop = subprocess.run([sys.executable, "-m", "orchestrator", "stop", run,
                               "--runs-dir", str(alice_runs)], cwd=REPO, env=ENV,
                              capture_output=True, text=True, timeout=300)
        deadline = time.monotonic() + 60
        while any(sandbox_cluster.run_processes(n, run) for n in NODES):
            assert time.monotonic() < deadline, f"alice's run left running: {stop.stdout}"
            time.sleep(1)
