"""The test a user runs in their head: provision a fresh cluster, train on it, break
something, see it stopped cleanly and resumed. Real containers, real SSH, real torchrun
across two nodes, the real training job on the generated dataset. (A node killed outright
is tested in tests/orchestrator/test_train_sandbox.py, on this same provisioned cluster.)"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..cluster import BIN, ENV, REPO, ProvisionedCluster, run

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox]
# Small and quick on two CPU cores; the generated classes are learnable.
SMALL = ["--width", "8", "--batch-size", "32", "--log-every", "10"]


def train(cluster: ProvisionedCluster, runs: Path, *script_args: str, opts: tuple[str, ...] = (),
          background: bool = False):
    argv = [sys.executable, "-m", "orchestrator", "train", "-i", str(cluster.inventory),
            "--nodes", "2", "--runs-dir", str(runs), *opts, "train.py", "--", *script_args]
    if background:  # output to a file: a pipe nobody reads would stall a chatty job
        out = open(runs / "orchestrator.out", "w")
        return subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=out, stderr=subprocess.STDOUT,
                                text=True)
    return run(*argv, timeout=900)


def summary(runs: Path) -> dict:
    (path,) = runs.glob("*/summary.json")  # exactly one run
    return json.loads(path.read_text())


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def no_training_left(cluster: ProvisionedCluster, nodes=("node0", "node1")) -> bool:
    return all(cluster.job_processes(n) == [] for n in nodes)


def test_site_yml_is_idempotent(sandbox_cluster):
    again = run(str(BIN / "ansible-playbook"), "-i", str(sandbox_cluster.inventory), "site.yml")
    assert again.returncode == 0, again.stdout[-4000:]
    recap = again.stdout[again.stdout.rindex("PLAY RECAP"):]
    changed = dict(re.findall(r"^(\S+)\s*:.*?changed=(\d+)", recap, re.M))
    assert set(changed) >= {"node0", "node1"}
    assert all(v == "0" for v in changed.values()), recap


def test_two_nodes_train_the_real_job_well_above_chance(sandbox_cluster, tmp_path):
    result = train(sandbox_cluster, tmp_path, "--epochs", "5", "--run-name", "e2e-learn",
                   "--metrics-json", "/mnt/cluster/results/e2e-learn.json", *SMALL)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    out = result.stdout
    # Every node's lines reach the terminal with their prefix; each rank reports in.
    assert re.search(r"^node0/rank0 \| rank 0/2 .* on node0", out, re.M), out[-3000:]
    assert re.search(r"^node1/rank1 \| rank 1/2 .* on node1", out, re.M), out[-3000:]
    s = summary(tmp_path)
    assert s["status"] == "succeeded"
    assert s["exit_codes"] == {"node0": 0, "node1": 0}
    metrics = json.loads((sandbox_cluster.share / "results" / "e2e-learn.json").read_text())["final"]
    # Ten classes: chance is 10 %. The generated classes are separable by their mean
    # colour pattern, so a few epochs of a real (if tiny) ResNet reach far above it
    # (about 0.85 here); 60 % leaves a margin for seeds while failing a run that did
    # not learn, or one whose ranks trained on the same shard.
    assert metrics["test_acc"] >= 0.6, metrics
    for name in ("node0", "node1"):
        assert (tmp_path / s["run_id"] / f"{name}.log").stat().st_size > 0


def test_ctrl_c_stops_every_training_process(sandbox_cluster, tmp_path):
    proc = train(sandbox_cluster, tmp_path, "--epochs", "50", "--run-name", "e2e-ctrlc", "--no-resume",
                 *SMALL, background=True)
    try:
        ckpts = sandbox_cluster.share / "checkpoints" / "e2e-ctrlc"
        wait_for(lambda: list(ckpts.glob("*.pt")), 300, "the first epoch's checkpoint")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        stopped = time.monotonic()
        wait_for(lambda: no_training_left(sandbox_cluster), 10, "no training process on any node")
        assert time.monotonic() - stopped < 10
        assert proc.returncode != 0
        assert summary(tmp_path)["status"] == "interrupted"
    finally:
        proc.kill()


def test_resume_after_a_worker_dies_with_max_restarts(sandbox_cluster, tmp_path):
    ckpts = sandbox_cluster.share / "checkpoints" / "e2e-resume"
    proc = train(sandbox_cluster, tmp_path, "--epochs", "6", "--run-name", "e2e-resume",
                 "--metrics-json", "/mnt/cluster/results/e2e-resume.json", *SMALL,
                 opts=("--max-restarts", "1", "--rdzv-backend", "c10d"), background=True)
    try:
        wait_for(lambda: len(list(ckpts.glob("*.pt"))) >= 2, 300, "two epoch checkpoints")
        # A worker on node1 dies as if the OOM killer took it (the worker only: torchrun,
        # whose command line also names train.py, must live on to restart it).
        ps = sandbox_cluster.exec("node1", "ps", "-eo", "pid=,args=").stdout
        workers = [line.split()[0] for line in ps.splitlines()
                   if re.match(r"\s*\d+ \S+/python[\d.]* -u \S*train\.py", line)]
        assert len(workers) == 1, ps
        sandbox_cluster.exec("node1", "kill", "-KILL", workers[0])
        proc.wait(timeout=600)
    finally:
        proc.kill()
    out = (tmp_path / "orchestrator.out").read_text()
    assert proc.returncode == 0, out[-5000:]
    assert "resumed from" in out
    final = json.loads((sandbox_cluster.share / "results" / "e2e-resume.json").read_text())["final"]
    assert final["epochs"] == 6
    assert final["resumed_from"]["epoch"] >= 2, final
