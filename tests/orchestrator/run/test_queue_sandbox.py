"""train --queue on the shared Slurm cluster (3 nodes, two fake GPUs each: a test double;
alice and bob may each hold 4 GPUs): runs that do not fit wait in Slurm's queue, never
two on one GPU (read from Slurm's accounting, not from our logs), and nothing is left in
the queue or on the nodes when train is interrupted while waiting or killed while
running. Real SSH through the bastion, real Slurm, real torchrun with gloo."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from ...cluster import ProvisionedCluster, orchestrator, wait_for
from .test_real_site_sandbox import SMALL, output, start_train

pytestmark = [pytest.mark.sandbox, pytest.mark.e2e, pytest.mark.timeout(900)]
FOUR_GPUS = ["--queue", "--nodes", "2", "--gpus-per-node", "2"]
SIX_GPUS = ["--queue", "--nodes", "3", "--gpus-per-node", "2"]   # over the per-user 4


def run_info(runs: Path) -> dict:
    (path,) = runs.glob("*/run.json")
    return json.loads(path.read_text())


def slurm(cluster: ProvisionedCluster, *argv: str) -> str:
    return cluster.exec("node0", *argv).stdout


def accounted(cluster: ProvisionedCluster, job: str) -> str:
    """JOB's end state in Slurm's accounting (sacct -X: the job, not its steps), once it
    has one: slurmdbd records it a moment after the job ends."""
    found: list[str] = []

    def ended() -> bool:
        state = slurm(cluster, "sacct", "-X", "-n", "-P", "-j", job, "-o", "State").strip()
        found[:] = [state]
        return state not in ("", "PENDING", "RUNNING", "COMPLETING", "REQUEUED")
    wait_for(ended, 60, f"job {job}'s end in Slurm's accounting")
    return found[0]


def queued_jobs(cluster: ProvisionedCluster, user: str) -> list[str]:
    return slurm(cluster, "squeue", "-h", "-u", user, "-o", "%i %j %T").splitlines()


def test_runs_that_do_not_fit_wait_and_never_share_a_gpu(sandbox_cluster: ProvisionedCluster,
                                                         tmp_path: Path) -> None:
    """alice and bob ask at once for 4 of the cluster's 6 GPUs each: both runs succeed,
    one after the other; the later one's record says how long it waited; accounting shows
    each job with its 4 GPUs and no two jobs on one node at the same time."""
    runs = {u: tmp_path / f"{u}-runs" for u in ("alice", "bob")}
    procs = {u: start_train(sandbox_cluster.inventories[u], runs[u], *FOUR_GPUS, "train.py",
                            "--", "--epochs", "2", "--run-name", f"queue-{u}", *SMALL)
             for u in runs}
    try:
        for user, proc in procs.items():
            assert proc.wait(timeout=600) == 0, output(runs[user])[-4000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    infos = {u: run_info(runs[u]) for u in runs}
    waited = sorted((infos[u]["slurm"]["waited_s"], u) for u in runs)
    later = waited[-1][1]
    assert waited[-1][0] >= 5, waited
    assert "queued as Slurm job" in output(runs[later]), output(runs[later])[-3000:]
    assert "waiting for GPUs to free" in output(runs[later]), output(runs[later])[-3000:]
    names = ",".join(f"clustertrain-{infos[u]['run_id']}" for u in runs)
    rows = slurm(sandbox_cluster, "sacct", "-a", "-X", "-n", "-P", f"--name={names}", "-o",
                 "JobName,User,NodeList,AllocTRES,Start,End").splitlines()
    jobs = []
    for row in rows:
        _name, user, nodelist, tres, start, end = row.split("|")
        nodes = slurm(sandbox_cluster, "scontrol", "show", "hostnames", nodelist).split()
        assert "gres/gpu=4" in tres, rows
        assert sorted(nodes) == sorted(infos[user]["slurm"]["nodes"]), (rows, infos[user])
        jobs.append((set(nodes), datetime.fromisoformat(start), datetime.fromisoformat(end)))
    assert len(jobs) == 2, rows
    (a_nodes, a_start, a_end), (b_nodes, b_start, b_end) = sorted(jobs, key=lambda j: j[1])
    assert a_nodes & b_nodes, "with 3 nodes, two 2-node runs share one"
    assert a_end <= b_start, f"two jobs held the same node's GPUs at once: {rows}"
    # each node's ranks were told the GPUs Slurm gave the run
    for user in runs:
        for node, gpus in infos[user]["slurm"]["gpus"].items():
            assert gpus == [0, 1], infos[user]["slurm"]
            env = infos[user]["node_commands"][node]["env"]
            assert env["CUDA_VISIBLE_DEVICES"] == "0,1", env
    # `usage` gives Slurm's accounting beside the records: bob his own jobs, an admin
    # (alice, --all: sacct as root) every user's
    def slurm_usage(user: str, *extra: str) -> dict:
        done = orchestrator("usage", "--json", "-i", str(sandbox_cluster.inventories[user]),
                            *extra, timeout=180)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        found = json.loads(done.stdout)["slurm"]
        assert found["error"] is None, found
        return found["users"]
    bobs = slurm_usage("bob")
    assert set(bobs) == {"bob"} and bobs["bob"]["gpu_hours"] > 0, bobs
    everyone = slurm_usage("alice", "--all")
    assert {"alice", "bob"} <= set(everyone), everyone
    assert everyone["bob"]["gpu_hours"] >= bobs["bob"]["gpu_hours"], (everyone, bobs)


def summary_of(runs: Path) -> dict:
    (path,) = runs.glob("*/summary.json")
    return json.loads(path.read_text())


def test_ctrl_c_or_stop_while_queued_and_kill_9_while_running_leave_nothing(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """bob's run waits behind alice's (`runs` says queued, `queue` says why); Ctrl-C of
    bob's train takes his job out of the queue, and so does `stop RUN` of his next one,
    each record saying how it ended; kill -9 of alice's running train takes hers out, and
    her processes end on every node."""
    alice_runs, bob_runs = tmp_path / "alice-runs", tmp_path / "bob-runs"
    bob_inv = str(sandbox_cluster.inventories["bob"])
    alice = start_train(sandbox_cluster.inventories["alice"], alice_runs, *FOUR_GPUS,
                        "train.py", "--", "--epochs", "200", "--run-name", "queue-long",
                        *SMALL)
    bob = None
    try:
        wait_for(lambda: "starting torchrun on" in output(alice_runs), 180, "alice's run")
        bob = start_train(sandbox_cluster.inventories["bob"], bob_runs, *FOUR_GPUS, "train.py",
                          "--", "--epochs", "1", *SMALL)
        wait_for(lambda: "queued as Slurm job" in output(bob_runs), 60, "bob's run to queue")
        assert queued_jobs(sandbox_cluster, "bob"), "bob's job is in the queue"
        alice_run = run_info(alice_runs)["run_id"]
        shown = orchestrator("queue", "-i", str(sandbox_cluster.inventories["bob"]))
        assert shown.returncode == 0, shown.stderr
        rows = {line.split()[1]: line for line in shown.stdout.splitlines()[1:]}
        assert f"run {alice_run}" in rows["alice"] and " running " in rows["alice"], shown.stdout
        assert "waiting #1" in rows["bob"] and "waiting for GPUs to free" in rows["bob"], (
            shown.stdout)
        listed = orchestrator("runs", "--runs-dir", str(bob_runs))
        assert " queued " in listed.stdout, listed.stdout + listed.stderr
        bob.send_signal(signal.SIGINT)
        bob.wait(timeout=30)
        wait_for(lambda: not queued_jobs(sandbox_cluster, "bob"), 30,
                 "bob's job to leave the queue")
        assert "starting torchrun" not in output(bob_runs)
        assert summary_of(bob_runs)["status"] == "interrupted"

        again_runs = tmp_path / "bob-again"
        bob = start_train(sandbox_cluster.inventories["bob"], again_runs, *FOUR_GPUS,
                          "train.py", "--", "--epochs", "1", *SMALL)
        wait_for(lambda: "queued as Slurm job" in output(again_runs), 60, "bob's next run")
        stopped = orchestrator("stop", run_info(again_runs)["run_id"], "-i", bob_inv,
                               "--runs-dir", str(again_runs))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "its job was cancelled" in stopped.stdout
        assert bob.wait(timeout=30) != 0
        wait_for(lambda: not queued_jobs(sandbox_cluster, "bob"), 30,
                 "bob's next job to leave the queue")
        assert summary_of(again_runs)["status"] == "stopped", output(again_runs)[-2000:]
        assert "stopped while queued" in output(again_runs)

        run_id = alice_run
        assert queued_jobs(sandbox_cluster, "alice")
        os.kill(alice.pid, signal.SIGKILL)
        alice.wait(timeout=10)
        wait_for(lambda: not queued_jobs(sandbox_cluster, "alice"), 30,
                 "alice's job to leave the queue")
        wait_for(lambda: not any(sandbox_cluster.run_processes(n, run_id)
                                 for n in sandbox_cluster.nodes), 90,
                 "alice's processes to end on every node")
    finally:
        for proc in (alice, bob):
            if proc is not None and proc.poll() is None:
                proc.kill()


def as_user(cluster: ProvisionedCluster, user: str, *argv: str) -> str:
    return cluster.exec("node0", "runuser", "-u", user, "--", *argv).stdout.strip()


def shares(cluster: ProvisionedCluster, column: str) -> dict[str, float]:
    """One sshare column per user: RawUsage (charged when a job ends) or FairShare (the
    factor a new job's priority is computed from, recomputed only every
    PriorityCalcPeriod)."""
    rows = slurm(cluster, "sshare", "-a", "-h", "-P", "-o", f"User,{column}").splitlines()
    return {user: float(value or 0) for user, value in
            (row.strip().split("|") for row in rows) if user}


def test_fair_share_who_used_the_cluster_less_starts_first(
        sandbox_cluster: ProvisionedCluster) -> None:
    """alice uses 4 GPUs for a while; then, while root holds 4 of the 6 GPUs, alice and
    bob each ask for 4 (only one can run after root's job), alice first: bob's job starts
    first, because his share of past use is smaller (priority/multifactor with
    accounting; the sandbox recalculates every minute: PriorityCalcPeriod,
    sandbox/group_vars)."""
    # A clean slate: earlier tests on this shared cluster ran jobs as both users, and bob's
    # may weigh more than alice's 20 s below (seen in a clean-clone run); Slurm's charged use
    # of the two is reset first, as an admin resets it.
    accounts = {u: a.strip() for a, u in (row.split("|") for row in slurm(
        sandbox_cluster, "sshare", "-a", "-h", "-P", "-o", "Account,User").splitlines())
        if u in ("alice", "bob")}
    for user, account in accounts.items():
        slurm(sandbox_cluster, "sacctmgr", "-i", "modify", "user", "where", f"name={user}",
              f"account={account}", "set", "RawUsage=0")
    assert shares(sandbox_cluster, "RawUsage").get("bob", 0) == 0
    used = as_user(sandbox_cluster, "alice", "sbatch", "--parsable", "-N2", "--gres=gpu:2",
                   "-J", "fairshare-use", "-o", "/dev/null", "--wrap", "sleep 20")
    wait_for(lambda: not slurm(sandbox_cluster, "squeue", "-h", "-j", used), 120,
             "alice's job to end")
    # The use is charged (RawUsage) when the job ends, but the factor a job's priority is
    # computed from follows only at the next recalculation: wait for the factor.
    wait_for(lambda: shares(sandbox_cluster, "RawUsage").get("alice", 0) >
             shares(sandbox_cluster, "RawUsage").get("bob", 0) + 20, 150,
             "accounting to charge alice's use (sshare RawUsage)")
    wait_for(lambda: shares(sandbox_cluster, "FairShare").get("bob", 0) >
             shares(sandbox_cluster, "FairShare").get("alice", 0), 150,
             "the fair-share factors to be recalculated (sshare FairShare)")
    # root holds 4 of the 6 GPUs for a while: neither 4-GPU job fits until it ends, and
    # then only one of them does.
    blocker = slurm(sandbox_cluster, "sbatch", "--parsable", "-N2", "-w", "node0,node1",
                    "--gres=gpu:2", "-J", "fairshare-block", "-o", "/dev/null", "--wrap",
                    "sleep 20").strip()
    jobs = {}
    try:
        wait_for(lambda: "RUNNING" in slurm(sandbox_cluster, "squeue", "-h", "-j", blocker,
                                            "-o", "%T"), 30, "root's job to hold the GPUs")
        for user in ("alice", "bob"):   # alice asks first
            jobs[user] = as_user(sandbox_cluster, user, "sbatch", "--parsable", "-N2",
                                 "--gres=gpu:2", "-J", f"fairshare-{user}", "-o",
                                 "/dev/null", "--wrap", "sleep 10")
        priority = {u: int(slurm(sandbox_cluster, "squeue", "-h", "-j", j, "-o", "%Q"))
                    for u, j in jobs.items()}
        assert priority["bob"] > priority["alice"], (priority,
                                                  shares(sandbox_cluster, "FairShare"))
        wait_for(lambda: "RUNNING" in slurm(sandbox_cluster, "squeue", "-h", "-j",
                                            ",".join(jobs.values()), "-o", "%T"), 90,
                 "one of the two to start")
        states = {u: slurm(sandbox_cluster, "squeue", "-h", "-j", j, "-o", "%T %r").strip()
                  for u, j in jobs.items()}
        assert states["bob"].startswith("RUNNING"), states
        assert states["alice"].startswith("PENDING"), states
    finally:
        slurm(sandbox_cluster, "scancel", blocker, *jobs.values())


def test_a_detached_run_holds_its_slurm_job_until_it_ends(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """train --queue --detach returns once the run runs on its nodes; the Slurm job stays
    granted without train, `attach` follows the run to its end, and then the queue holds
    nothing (the nodes cancelled the job). A detached run whose job is cancelled by hand
    (scancel, as an admin would) stops on every node, its record saying why."""
    inventory = str(sandbox_cluster.inventories["alice"])

    def detach(runs: Path, epochs: str) -> dict:
        # a run name of its own: another test's checkpoints (other settings) are not resumed
        done = orchestrator("train", "-i", inventory, "--runs-dir", str(runs), *FOUR_GPUS,
                            "--detach", "train.py", "--", "--epochs", epochs, "--run-name",
                            f"queue-detached-{runs.name}", "--no-resume", *SMALL)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "supervised by the nodes (detached)" in done.stdout, done.stdout
        return run_info(runs)

    short = detach(tmp_path / "short", "2")
    followed = orchestrator("attach", short["run_id"], "--runs-dir", str(tmp_path / "short"))
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr[-2000:]
    assert summary_of(tmp_path / "short")["status"] == "succeeded"
    wait_for(lambda: not queued_jobs(sandbox_cluster, "alice"), 90,
             "the nodes to end the finished run's job")
    assert accounted(sandbox_cluster, short["slurm"]["job_id"]) == "COMPLETED"

    long = detach(tmp_path / "long", "200")
    job = long["slurm"]["job_id"]
    assert queued_jobs(sandbox_cluster, "alice") == [
        f"{job} clustertrain-{long['run_id']} RUNNING"], "train has ended; the job stays"
    wait_for(lambda: all(sandbox_cluster.run_processes(n, long["run_id"])
                         for n in long["nodes"]), 60, "the run to run on its nodes")
    slurm(sandbox_cluster, "scancel", job)
    followed = orchestrator("attach", long["run_id"], "--runs-dir", str(tmp_path / "long"),
                            timeout=180)
    assert followed.returncode != 0, followed.stdout[-3000:]
    summary = summary_of(tmp_path / "long")
    assert summary["status"] == "stopped", summary
    assert f"its Slurm job {job} ended" in json.dumps(summary), summary
    wait_for(lambda: not any(sandbox_cluster.run_processes(n, long["run_id"])
                             for n in sandbox_cluster.nodes), 90,
             "the run's processes to end on every node")


def test_a_request_above_the_per_user_limit_is_refused_at_once_naming_it(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """bob asks for 6 GPUs where one user may hold 4: no end of other jobs would ever let
    it start, so train refuses it within seconds (exit 2), naming the limit and what to ask
    for instead, and Slurm never saw a job of it (neither squeue nor sacct)."""
    runs = tmp_path / "runs"
    started = time.monotonic()
    done = orchestrator("train", "-i", str(sandbox_cluster.inventories["bob"]), "--runs-dir",
                        str(runs), *SIX_GPUS, "train.py", "--", "--epochs", "1", *SMALL,
                        timeout=120)
    took = time.monotonic() - started
    said = done.stdout + done.stderr
    assert done.returncode == 2, said[-3000:]
    assert took < 30, f"refused after {took:.1f} s"
    assert ("6 GPUs (3 node(s) x 2) is more than one user may hold at once: 4 (QOS "
            "clustertrain-gpus, MaxTRESPerUser=gres/gpu=4); ask for at most 4, e.g. "
            "--nodes 2 --gpus-per-node 2") in said, said[-3000:]
    assert "Nothing was queued" in said
    assert "starting torchrun" not in said and "queued as Slurm job" not in said
    name = f"clustertrain-{run_info(runs)['run_id']}"
    assert not slurm(sandbox_cluster, "squeue", "-h", "-n", name)
    assert not slurm(sandbox_cluster, "sacct", "-a", "-X", "-n", f"--name={name}", "-S",
                     "now-1hours", "-o", "JobID")
    assert summary_of(runs)["status"] == "failed"


def test_slurm_itself_refuses_a_job_above_the_per_user_limit(
        sandbox_cluster: ProvisionedCluster) -> None:
    """DenyOnLimit on the role's QOS: bob's plain sbatch for 6 GPUs, by hand, is refused
    when submitted instead of waiting for ever as QOSMaxGRESPerUser."""
    name = "over-limit-by-hand"
    done = sandbox_cluster.exec("node0", "runuser", "-u", "bob", "--", "sbatch", "--parsable",
                                "-N3", "--gres=gpu:2", "-J", name, "-o", "/dev/null", "--wrap",
                                "true", check=False)
    try:
        assert done.returncode != 0, f"sbatch queued job {done.stdout.strip()}"
        assert "QOS" in done.stderr, done.stderr
        assert not slurm(sandbox_cluster, "squeue", "-h", "-n", name)
    finally:
        slurm(sandbox_cluster, "scancel", "-n", name, "-u", "bob")


def test_waiting_at_the_per_user_limit_the_line_names_what_the_user_holds(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """bob holds 4 GPUs in a job of his own; his 2-GPU run waits at the per-user limit and
    its line says so, naming his job, not another's; Ctrl-C takes it out of the queue."""
    held = as_user(sandbox_cluster, "bob", "sbatch", "--parsable", "-N2", "--gres=gpu:2",
                   "-J", "bob-holds-four", "-o", "/dev/null", "--wrap", "sleep 120")
    runs = tmp_path / "runs"
    proc = None
    try:
        wait_for(lambda: "RUNNING" in slurm(sandbox_cluster, "squeue", "-h", "-j", held, "-o",
                                            "%T"), 60, "bob's job to hold 4 GPUs")
        proc = start_train(sandbox_cluster.inventories["bob"], runs, "--queue", "--nodes", "1",
                           "--gpus-per-node", "2", "train.py", "--", "--epochs", "1", *SMALL)
        wait_for(lambda: "already held by you" in output(runs), 90,
                 "the waiting line at the per-user limit")
        line = next(x for x in output(runs).splitlines() if "already held by you" in x)
        assert "with the 4 GPU(s) already held by you in running jobs" in line, line
        assert f"held by bob's job bob-holds-four (job {held}," in line, line
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        wait_for(lambda: not slurm(sandbox_cluster, "squeue", "-h", "-u", "bob", "-n",
                                   f"clustertrain-{run_info(runs)['run_id']}"), 30,
                 "bob's waiting job to leave the queue")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        slurm(sandbox_cluster, "scancel", held)
