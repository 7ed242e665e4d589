"""A --queue run on a node that a run started outside Slurm uses (issue 69), on the shared
Slurm cluster: Slurm knows nothing of alice's run started without --queue and gives its
node to bob's queued run; that run does not start beside it unasked, says whose run is
there and what to do, and gives its Slurm job back. Beside another queued run (a Slurm
job of its own, on other GPUs of the node) a queued run starts as before, without the
--share-gpus warning. Real SSH through the bastion, real Slurm, real torchrun with gloo."""

from __future__ import annotations

from pathlib import Path

import pytest

from ...cluster import ProvisionedCluster, orchestrator, wait_for
from .test_queue_sandbox import queued_jobs, run_info, summary_of
from .test_real_site_sandbox import SMALL, output, start_train

pytestmark = [pytest.mark.sandbox, pytest.mark.e2e, pytest.mark.timeout(600)]
NODE = "node1"
ON_NODE = ["--queue", "--hosts", NODE, "--gpus-per-node", "1"]   # Slurm's -w node1


def detached(cluster: ProvisionedCluster, user: str, runs: Path, *options: str) -> str:
    """USER's long run on NODE, detached (OPTIONS: --queue ... or none: started outside
    Slurm), once it runs there; its id."""
    done = orchestrator("train", "-i", str(cluster.inventories[user]), "--runs-dir",
                        str(runs), *options, "--detach", *([] if options else ["--hosts", NODE]),
                        "train.py", "--", "--epochs", "200", "--run-name",
                        f"beside-{runs.name}", "--no-resume", *SMALL, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_id: str = run_info(runs)["run_id"]
    wait_for(lambda: cluster.run_processes(NODE, run_id, user), 60, f"{user}'s run on {NODE}")
    return run_id


def stop(cluster: ProvisionedCluster, user: str, runs: Path, run_id: str) -> None:
    orchestrator("stop", run_id, "-i", str(cluster.inventories[user]), "--runs-dir",
                 str(runs), timeout=180)
    wait_for(lambda: not cluster.run_processes(NODE, run_id, user), 90,
             f"{user}'s run to end on {NODE}")


def bobs_queued_run(cluster: ProvisionedCluster, runs: Path, timeout: float,
                    *script_args: str) -> tuple[int | None, str]:
    """bob's queued train.py on NODE (SCRIPT_ARGS after --epochs 1), waited for: its exit
    status and its output (killed if it outlasts TIMEOUT)."""
    bob = start_train(cluster.inventories["bob"], runs, *ON_NODE, "train.py", "--",
                      "--epochs", "1", *script_args, *SMALL)
    try:
        code = bob.wait(timeout=timeout)
    finally:
        if bob.poll() is None:
            bob.kill()
    return code, output(runs)


def test_a_queued_run_does_not_start_beside_a_run_slurm_does_not_know(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """alice's run started without --queue holds node1; bob's --queue run, which Slurm
    grants node1, is refused by its check naming alice's run and the ways out, starts
    nothing there, and leaves nothing in the queue; alice's run goes on."""
    alice_runs, bob_runs = tmp_path / "alice-outside", tmp_path / "bob-queued"
    alice = detached(sandbox_cluster, "alice", alice_runs)
    try:
        code, said = bobs_queued_run(sandbox_cluster, bob_runs, 300)
        assert "running beside it (--share-gpus)" not in said, said[-3000:]
        assert "starting torchrun" not in said, said[-3000:]
        assert code != 0, said[-3000:]
        assert "granted after" in said, said[-3000:]   # Slurm did put it on node1
        assert (f"problem: {NODE} is in use by alice's run {alice}, started outside Slurm "
                "(without --queue): Slurm counts those GPUs free") in said, said[-3000:]
        assert "pass --share-gpus to run beside it" in said, said[-3000:]
        assert summary_of(bob_runs)["status"] == "failed"
        wait_for(lambda: not queued_jobs(sandbox_cluster, "bob"), 30,
                 "bob's job to leave the queue")
        assert sandbox_cluster.run_processes(NODE, alice, "alice"), "alice's run goes on"
    finally:
        stop(sandbox_cluster, "alice", alice_runs, alice)


def test_a_queued_run_starts_beside_another_queued_run_on_other_gpus(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """alice's queued run holds one of node1's two GPUs (a Slurm job); bob's queued run,
    granted the other, is no refusal and says nothing of --share-gpus: Slurm shared the
    node out."""
    alice_runs, bob_runs = tmp_path / "alice-queued", tmp_path / "bob-beside"
    alice = detached(sandbox_cluster, "alice", alice_runs, *ON_NODE)
    try:
        code, said = bobs_queued_run(sandbox_cluster, bob_runs, 400, "--run-name",
                                     f"beside-{bob_runs.name}", "--no-resume")
        assert code == 0, said[-3000:]
        assert "--share-gpus" not in said and "problem:" not in said, said[-3000:]
        gpus = {u: run_info(r)["slurm"]["gpus"][NODE]
                for u, r in (("alice", alice_runs), ("bob", bob_runs))}
        assert not set(gpus["alice"]) & set(gpus["bob"]), gpus
    finally:
        stop(sandbox_cluster, "alice", alice_runs, alice)
