"""Which of a node's users a queued run's preflight leaves to Slurm (issue 69): runs and
GPU processes that are steps of a Slurm job (a `slurmstepd: [JOB.STEP]` among their
ancestors, or a Slurm job's cgroup) are Slurm's to share out; those started outside Slurm
are not. Real processes on this machine, found by busy.scan as preflight's probe finds
them, with a stand-in slurmstepd (its process title) and nvidia-smi (a test double)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.node import busy

from ..node.test_busy import UUIDS, fake_smi
from .test_preflight import facts, judged

IN_SLURM = "20260101-120000-a1b2c3"    # bob's queued run, a step of his job 42
OUTSIDE = "20260101-130000-d4e5f6"     # alice's run started without --queue


def supervisor(tmp_path: Path, run: str) -> list[str]:
    """The command line of a stand-in supervisor of RUN: named as the launch names one
    (node.py supervise --run RUN -- torchrun ...), it only sleeps."""
    entry = tmp_path / "node.py"
    entry.write_text("import time\ntime.sleep(300)\n")
    return [sys.executable, str(entry), "supervise", "--run", run, "--", "torchrun"]


def stepd(job: str, *children: list[str]) -> tuple[subprocess.Popen, list[int]]:
    """A stand-in slurmstepd of step JOB.0 (its process title, as Slurm's sets it) that
    starts CHILDREN as the step's tasks; it and their PIDs."""
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        kids = [subprocess.Popen(argv) for argv in {[list(c) for c in children]!r}]
        print(" ".join(str(k.pid) for k in kids), flush=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([f"slurmstepd: [{job}.0]", "-c", code], executable=sys.executable,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    return proc, [int(pid) for pid in proc.stdout.readline().split()]


@pytest.fixture
def node(tmp_path: Path):
    """This machine as a node Slurm shares out: bob's queued run and a bare GPU process
    of his job 42 (under the stand-in slurmstepd), alice's run started outside Slurm and
    carol's bare GPU process of no job; the nvidia-smi double puts the bare ones on GPUs
    2 and 3. The scan, as preflight's probe makes it."""
    sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
    step, (_, in_job) = stepd("42", supervisor(tmp_path, IN_SLURM), sleep)
    outside = [subprocess.Popen(supervisor(tmp_path, OUTSIDE)), subprocess.Popen(sleep)]
    try:
        smi = fake_smi(tmp_path, f"{in_job}, {UUIDS[2]}, 512\n"
                                 f"{outside[1].pid}, {UUIDS[3]}, 300\n")
        deadline = time.monotonic() + 30
        # the stand-ins' command lines are theirs once they have started (exec)
        found = busy.scan(smi=str(smi))
        while not {IN_SLURM, OUTSIDE} <= {r.run for r in found.runs}:
            assert time.monotonic() < deadline, found
            time.sleep(0.1)
            found = busy.scan(smi=str(smi))
        yield found, in_job, outside[1].pid
    finally:
        for proc in outside:
            proc.kill()
            proc.wait()
        os.killpg(step.pid, signal.SIGKILL)
        step.wait()


def test_the_scan_names_the_slurm_job_of_each_run_and_gpu_process(node) -> None:
    found, in_job, outside = node
    runs = {r.run: r.slurm_job for r in found.runs}
    assert (runs[IN_SLURM], runs[OUTSIDE]) == ("42", None)
    jobs = {g.pid: g.slurm_job for g in found.gpu_processes}
    assert jobs == {in_job: "42", outside: None}
    assert busy.Busy.from_json(found.to_json()) == found


def test_a_queued_run_is_refused_only_for_what_runs_outside_slurm(node) -> None:
    found, in_job, outside = node
    r = judged(facts("node1", {}, busy=found), queued={"node1": [0]})
    [problem] = r.problems
    assert f"'s run {OUTSIDE}" in problem and f" PID {outside} of " in problem, problem
    assert IN_SLURM not in problem and f"PID {in_job} " not in problem, problem
    assert "started outside Slurm (without --queue)" in problem, problem
    assert "pass --share-gpus to run beside them" in problem, problem


def test_slurms_marks_a_step_title_and_a_jobs_cgroup() -> None:
    """slurmstepd's process title for a step, the batch script and the extern step; the
    cgroup of a job's process under proctrack/cgroup (v2, then v1)."""
    assert busy.stepd_job("slurmstepd: [42.0]") == "42"
    assert busy.stepd_job("slurmstepd: [7.extern]   ") == "7"
    assert busy.stepd_job("slurmstepd: [7.batch]") == "7"
    assert busy.stepd_job("/usr/sbin/slurmd -D ") is None
    assert busy.stepd_job("python slurmstepd: [1.0]") is None
    assert busy.stepd_job("") is None
    assert busy.cgroup_job("0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n") \
        == "42"
    assert busy.cgroup_job("12:pids:/slurm/uid_1001/job_42/step_0/task_0\n"
                           "4:devices:/slurm/uid_1001/job_42/step_0/task_0\n") == "42"
    assert busy.cgroup_job("0::/user.slice/user-1001.slice/session-3.scope\n") is None
