"""Which limits a --queue request can never be within (orchestrator/node/queuelimits.py),
read from `scontrol show partition -o` and `sacctmgr show qos` output recorded on the
sandbox's Slurm cluster (slurm_records/: 3 nodes, two fake GPUs each, at most 4 GPUs per
user). The refusal on the cluster itself: tests/orchestrator/run/test_queue_sandbox.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.node import queuelimits
from orchestrator.node.queuelimits import Ask, Breach, Limit, Qos
from orchestrator.run.allocation import AllocationRequest

RECORDS = Path(__file__).parent / "slurm_records"
REPO = Path(__file__).resolve().parents[3]
PARTITIONS = (RECORDS / "scontrol-show-partition-o.txt").read_text()
QOS = (RECORDS / "sacctmgr-show-qos.txt").read_text()


def test_the_ask_of_trains_salloc_options() -> None:
    """What run/allocation.py asks salloc for is what the check reads back."""
    request = AllocationRequest(nodes=3, gpus_per_node=2, partition="gpu", time="1-12:00",
                                qos="high")
    assert request.node_request("x").gpus_per_node == "2"
    assert Ask.from_salloc(request.salloc_args(), ["--gres=gpu:2"]) == Ask(
        3, 2, "gpu", 36 * 3600, "high")
    hosts = AllocationRequest(hosts=("node0", "node2")).salloc_args()
    assert Ask.from_salloc(hosts, []) == Ask(2, 0)


def test_slurm_times() -> None:
    seconds = queuelimits.seconds
    assert [seconds(t) for t in ("90", "90:30", "2:00:00", "1-0", "1-2:30", "1-02:30:15",
                                 "UNLIMITED", "INFINITE")] == [
        5400, 5430, 7200, 86400, 95400, 95415, None, None]
    assert queuelimits.slurm_time(95415) == "1-02:30:15"
    assert queuelimits.slurm_time(7200) == "2:00:00"


def test_the_sandbox_partition_and_its_qos() -> None:
    (gpu,) = queuelimits.partitions(PARTITIONS)
    assert (gpu.name, gpu.default, gpu.total_nodes, gpu.max_nodes, gpu.max_time_s,
            gpu.qos) == ("gpu", True, 3, None, None, "clustertrain-gpus")
    qos = queuelimits.qoses(QOS)
    assert qos["clustertrain-gpus"] == Qos("clustertrain-gpus", None, 4, False)
    assert qos["normal"] == Qos("normal", None, None, False)


def test_more_gpus_than_one_user_may_hold_is_a_breach_fewer_is_not() -> None:
    (gpu,) = queuelimits.partitions(PARTITIONS)
    qos = queuelimits.qoses(QOS)
    assert queuelimits.breaches(Ask(3, 2), gpu, qos) == [
        Breach(Limit.GPUS_PER_USER, 6, 4, "QOS clustertrain-gpus",
               "MaxTRESPerUser=gres/gpu=4")]
    assert queuelimits.breaches(Ask(2, 2), gpu, qos) == []   # waits, if it must, and starts
    assert queuelimits.breaches(Ask(3, 1, time_s=10 ** 7), gpu, qos) == []   # no MaxTime


def test_more_nodes_than_the_partition_has_or_a_time_above_its_max() -> None:
    limited = PARTITIONS.replace("MaxTime=UNLIMITED", "MaxTime=1-00:00:00")
    (gpu,) = queuelimits.partitions(limited)
    found = queuelimits.breaches(Ask(4, 1, time_s=2 * 86400), gpu, {})
    assert found == [Breach(Limit.NODES, 4, 3, "partition gpu", "TotalNodes=3"),
                     Breach(Limit.TIME, 2 * 86400, 86400, "partition gpu",
                            "MaxTime=1-00:00:00")]
    (two,) = queuelimits.partitions(PARTITIONS.replace("MaxNodes=UNLIMITED", "MaxNodes=2"))
    assert [b.limit for b in queuelimits.breaches(Ask(3, 0), two, {})] == [Limit.NODES_PER_JOB]


def test_the_partitions_qos_counts_unless_the_named_one_overrides_it() -> None:
    (gpu,) = queuelimits.partitions(PARTITIONS)
    qos = {**queuelimits.qoses(QOS), "big": Qos("big", 8, 8, False),
           "over": Qos("over", None, 8, True)}
    assert [(b.limit, b.most, b.where) for b in queuelimits.breaches(
        Ask(3, 2, qos="big"), gpu, qos)] == [(Limit.GPUS_PER_USER, 4,
                                              "QOS clustertrain-gpus")]
    assert queuelimits.breaches(Ask(3, 2, qos="over"), gpu, qos) == []
    assert [(b.limit, b.most) for b in queuelimits.breaches(
        Ask(3, 4, qos="big"), gpu, qos)] == [(Limit.GPUS_PER_JOB, 8),
                                            (Limit.GPUS_PER_USER, 4)]


# sbatch as Slurm answers a job it queues (--parsable: its id), and squeue's word for it.
SBATCH_QUEUED = "echo 77\n"
# Slurm's own refusal of a request above a QOS with DenyOnLimit, as sbatch says it.
SBATCH_DENIED = ("echo 'sbatch: error: Batch job submission failed: Job violates "
                 "accounting/QOS policy (job submit limit, user'\\''s size and/or time "
                 "limits)' >&2\nexit 1\n")


def slurm_bin(tmp_path: Path, sbatch: str = "exit 0\n", squeue: str = "") -> Path:
    """Slurm's clients as the sandbox's answer them (recorded), an sbatch that writes down
    that it was called and then runs SBATCH, an squeue that says SQUEUE, and an scancel
    that writes down its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", PARTITIONS), ("sacctmgr", QOS), ("sinfo", "gpu:2\n" * 3),
                       ("squeue", squeue)):
        (bin_dir / f"{name}.out").write_text(text)
        (bin_dir / name).write_text(f"#!/bin/sh\ncat '{bin_dir}/{name}.out'\n")
    # once scancel has said anything to the job, squeue no longer lists it (it ended)
    (bin_dir / "squeue").write_text(f"#!/bin/sh\n[ -e '{tmp_path}/cancelled' ] || "
                                    f"cat '{bin_dir}/squeue.out'\n")
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\necho \"$@\" > '{tmp_path}/submitted'\n"
                                    + sbatch)
    (bin_dir / "scancel").write_text(f"#!/bin/sh\necho \"$@\" >> '{tmp_path}/cancelled'\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    return bin_dir


def allocate(tmp_path: Path, sbatch: str, *salloc_args: str, squeue: str = "PENDING\n",
             said: str | None = None) -> subprocess.CompletedProcess:
    """node.py allocate as train runs it: its standard input open (train's connection);
    with SAID, that is written to it once it says the job was granted, then it is closed."""
    env = {**os.environ,
           "PATH": f"{slurm_bin(tmp_path, sbatch, squeue)}:{os.environ['PATH']}"}
    argv = [sys.executable, "-m", "orchestrator.node", "allocate", "--name", "clustertrain-x",
            "--gpus-per-node", "all", "--", *salloc_args]
    with subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.PIPE, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        out = ""
        if said is not None:
            out = proc.stdout.readline()
            assert json.loads(out)["event"] == "granted", out
            proc.stdin.write(said)
            proc.stdin.close()
        code = proc.wait(timeout=60)
        assert proc.stderr is not None
        return subprocess.CompletedProcess(argv, code, out + proc.stdout.read(),
                                           proc.stderr.read())


OVER_PER_USER = {"event": "over-limit", "job": "", "nodes": 3, "gpus_per_node": 2,
                 "limits": [{"limit": "gpus-per-user", "asked": 6, "most": 4,
                             "where": "QOS clustertrain-gpus",
                             "setting": "MaxTRESPerUser=gres/gpu=4"}]}


def test_allocate_refuses_more_nodes_than_the_partition_has_before_sbatch(
        tmp_path: Path) -> None:
    """node.py allocate says which limit and ends with exit 2; sbatch never runs."""
    done = allocate(tmp_path, SBATCH_QUEUED, "-N", "4")
    assert done.returncode == 2, done.stdout + done.stderr
    event = json.loads(done.stdout.splitlines()[-1])
    assert event["event"] == "over-limit" and [lim["setting"] for lim in event["limits"]] == [
        "TotalNodes=3"], event
    assert not (tmp_path / "submitted").exists()


def test_slurms_own_refusal_above_the_qos_is_said_with_the_limit(tmp_path: Path) -> None:
    """The QOS is read beside sbatch; Slurm refuses the request itself (DenyOnLimit), and
    allocate says the limit it is above, as before, not only Slurm's words."""
    done = allocate(tmp_path, SBATCH_DENIED, "-N", "3")
    assert done.returncode == 2, done.stdout + done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == OVER_PER_USER
    assert (tmp_path / "submitted").exists()


def test_a_job_waiting_above_a_qos_without_deny_on_limit_is_cancelled(tmp_path: Path) -> None:
    """A QOS without DenyOnLimit lets the job wait for ever: it is cancelled as soon as the
    QOS is read, with the limit said."""
    done = allocate(tmp_path, SBATCH_QUEUED, "-N", "3")
    assert done.returncode == 2, done.stdout + done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == OVER_PER_USER
    assert (tmp_path / "cancelled").read_text().splitlines()[0] == "77"


def test_without_slurms_limits_nothing_is_refused_here() -> None:
    """No Slurm client on this machine: nothing can be read, Slurm decides."""
    ask = Ask(300, 8)
    part = queuelimits.partition(ask)
    assert part is None and queuelimits.breaches(ask, part, queuelimits.qos_of(ask, part)) == []


@pytest.mark.parametrize(("said", "cancelled"), [
    ("end 0\n", ["--batch --signal=USR1 77"]),   # succeeded: COMPLETED
    ("end 1\n", ["--batch --signal=USR2 77"]),   # failed: FAILED
    ("", ["77", f"--name=clustertrain-x --user={os.environ.get('USER') or os.getuid()}"]),
])   # no word: train gone (Ctrl-C, kill -9), the job is cancelled (CANCELLED)
def test_a_granted_job_ends_as_its_run_said(tmp_path: Path, said: str,
                                            cancelled: list[str]) -> None:
    """The holding batch job is told how the run ended (its script leaves with 0 or 1:
    COMPLETED or FAILED in sacct); without a word, the job is cancelled."""
    done = allocate(tmp_path, SBATCH_QUEUED, "-N", "2", squeue="RUNNING\n", said=said)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "cancelled").read_text().splitlines() == cancelled
    submitted = (tmp_path / "submitted").read_text()
    assert "--parsable --job-name=clustertrain-x" in submitted and "--wrap=" in submitted


def test_the_holding_script_leaves_as_it_is_told(tmp_path: Path) -> None:
    """allocate.HOLD, run by a real shell: SIGUSR1 ends it with 0, SIGUSR2 with 1, at once
    (not after its sleep)."""
    import signal
    import time

    from orchestrator.node.allocate import HOLD
    for sig, code in ((signal.SIGUSR1, 0), (signal.SIGUSR2, 1)):
        proc = subprocess.Popen(["/bin/sh", "-c", HOLD])
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == code
        assert time.monotonic() - sent < 2
