"""A --queue run inside Slurm on the shared Slurm cluster: each node's supervisor, with
torchrun and its workers, is a step of the run's job, so Slurm accounts for them and
nothing of the run outlives the job, however it ends (scancel by an admin, kill -9 of
train). Real SSH through the bastion, real Slurm, real torchrun with gloo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ...cluster import ProvisionedCluster, wait_for
from .test_queue_sandbox import FOUR_GPUS, accounted, run_info, slurm, summary_of
from .test_real_site_sandbox import SMALL, output, start_train

pytestmark = [pytest.mark.sandbox, pytest.mark.e2e, pytest.mark.timeout(600)]


def in_queue(cluster: ProvisionedCluster, job: str) -> bool:
    """squeue still lists JOB (running, or completing: Slurm has not let its nodes go)."""
    return bool(slurm(cluster, "squeue", "-h", "-j", job, "-o", "%T").strip())


def left_on_nodes(cluster: ProvisionedCluster, run_id: str) -> dict[str, list[str]]:
    """Each node's live processes of RUN_ID (supervisor, torchrun, workers)."""
    return {n: pids for n in cluster.nodes if (pids := cluster.run_processes(n, run_id))}


def cpu_seconds(text: str) -> float:
    """sacct's TotalCPU ([DD-][HH:]MM:SS[.mmm]) in seconds."""
    days, _, clock = text.rpartition("-")
    parts = [float(p) for p in clock.split(":")]
    return float(days or 0) * 86400 + sum(p * 60 ** i for i, p in enumerate(reversed(parts)))


def running(cluster: ProvisionedCluster, runs: Path, proc: subprocess.Popen) -> dict:
    """The record of the run that PROC's train started, once it runs on each of its
    nodes and has printed an epoch."""
    wait_for(lambda: proc.poll() is not None or " epoch " in output(runs), 240,
             "the run's first epoch")
    assert proc.poll() is None, output(runs)[-3000:]
    info = run_info(runs)
    wait_for(lambda: all(cluster.run_processes(n, info["run_id"]) for n in info["nodes"]),
             60, "the run's processes on each of its nodes")
    return info


def long_queued_run(cluster: ProvisionedCluster, runs: Path, name: str) -> subprocess.Popen:
    """alice's --queue run of the example job, long enough to be ended from outside."""
    return start_train(cluster.inventories["alice"], runs, *FOUR_GPUS, "train.py", "--",
                       "--epochs", "200", "--run-name", name, "--no-resume", *SMALL)


def test_a_queued_runs_processes_are_steps_of_its_job_with_their_cpu_time(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """sacct lists one step per node of a --queue run, on that node, with the CPU time
    its processes used (the supervisor, torchrun and the training ranks)."""
    runs = tmp_path / "runs"
    proc = start_train(sandbox_cluster.inventories["alice"], runs, *FOUR_GPUS, "train.py",
                       "--", "--epochs", "2", "--run-name", f"steps-{tmp_path.name}",
                       "--no-resume", *SMALL)
    try:
        assert proc.wait(timeout=400) == 0, output(runs)[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    info = run_info(runs)
    job = info["slurm"]["job_id"]

    def steps() -> dict[str, tuple[str, float]]:
        """Each step's node, name and CPU seconds (slurmdbd has them a moment after)."""
        rows = slurm(sandbox_cluster, "sacct", "-j", job, "-n", "-P", "-o",
                     "JobID,JobName,NodeList,TotalCPU").splitlines()
        # JOB.N: the run's steps (JOB.batch holds the allocation: node/allocate.py HOLD)
        return {nodes: (name, cpu_seconds(cpu)) for step, name, nodes, cpu in
                (r.split("|") for r in rows)
                if step.startswith(f"{job}.") and step.split(".")[1].isdigit()}

    deadline = time.monotonic() + 60
    while not (steps() and all(cpu > 0 for _, cpu in steps().values())) \
            and time.monotonic() < deadline:
        time.sleep(1)
    found = steps()
    assert sorted(found) == sorted(info["slurm"]["nodes"]), found
    assert all(name == "clustertrain-supervisor" and cpu > 0
               for name, cpu in found.values()), found
    # the run succeeded, and so did its job (not CANCELLED: its end was said to Slurm)
    assert accounted(sandbox_cluster, job) == "COMPLETED"


def test_a_queued_run_that_fails_is_a_failed_job_in_slurms_accounting(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    proc = start_train(sandbox_cluster.inventories["alice"], runs, *FOUR_GPUS, "train.py",
                       "--", "--epochs", "1", "--data-dir", "/nonexistent", *SMALL)
    try:
        assert proc.wait(timeout=400) != 0, output(runs)[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert summary_of(runs)["status"] == "failed", output(runs)[-3000:]
    assert accounted(sandbox_cluster, run_info(runs)["slurm"]["job_id"]) == "FAILED"


def test_scancel_ends_the_run_on_every_node_before_slurm_lets_the_job_go(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """An admin's `scancel JOB` while a --queue run trains: once squeue no longer lists
    the job, no process of the run is left on any node, train ends, and the run's record
    says Slurm ended it."""
    runs = tmp_path / "runs"
    proc = long_queued_run(sandbox_cluster, runs, f"scancel-{tmp_path.name}")
    try:
        info = running(sandbox_cluster, runs, proc)
        job = info["slurm"]["job_id"]
        slurm(sandbox_cluster, "scancel", job)
        wait_for(lambda: not in_queue(sandbox_cluster, job), 60, "Slurm to let the job go")
        assert not left_on_nodes(sandbox_cluster, info["run_id"])
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = summary_of(runs)
    assert summary["status"] == "stopped", summary
    assert f"its Slurm job {job} ended" in json.dumps(summary), summary
    assert accounted(sandbox_cluster, job).startswith("CANCELLED")


def test_after_kill_9_of_train_nothing_of_the_run_outlives_its_slurm_job(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """kill -9 of an attached train --queue: its allocation ends with its connection, and
    3 s after squeue no longer lists the job, none of the run's processes is alive on any
    node (before, they went on for the controller's lease, on GPUs Slurm counted free)."""
    runs = tmp_path / "runs"
    proc = long_queued_run(sandbox_cluster, runs, f"kill9-{tmp_path.name}")
    try:
        info = running(sandbox_cluster, runs, proc)
        job = info["slurm"]["job_id"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for(lambda: not in_queue(sandbox_cluster, job), 60, "Slurm to let the job go")
        time.sleep(3)
        assert not left_on_nodes(sandbox_cluster, info["run_id"])
        assert accounted(sandbox_cluster, job).startswith("CANCELLED")
    finally:
        if proc.poll() is None:
            proc.kill()
