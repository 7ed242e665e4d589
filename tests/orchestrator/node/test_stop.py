"""The job-scoped stop script, run for real on this machine against real process trees.

A fake "torchrun" (shell in its own session, recording its PGID like the launch command)
starts a "worker" in a session of its own, as torchrun does; one job ignores SIGTERM so
that the SIGKILL path is exercised. A second job must survive the first one's stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

WORKER = ("import os, signal, subprocess, sys, time\n"
          "if sys.argv[1] == 'stubborn': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
          " start_new_session=True)\n"
          "time.sleep(300)\n")


# As torchrun ends on SIGTERM: it passes the signal on to its worker, waits for it, then
# takes long to leave (torch's teardown, seconds on a loaded node).
LINGERING = ("import signal, subprocess, sys, time\n"
             "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
             " start_new_session=True)\n"
             "def term(*_):\n"
             "    worker.terminate(); worker.wait(); time.sleep(300)\n"
             "signal.signal(signal.SIGTERM, term)\n"
             "time.sleep(300)\n")


def start_job(job: Path, mode: str, run_id: str | None = None,
              program: str = WORKER) -> subprocess.Popen:
    """Like the launch: the group leader records its PID and carries the run id."""
    job.mkdir(parents=True)
    inner = (f"echo $$ > {job}/pgid; export CLUSTERTRAIN_RUN_ID={run_id or job.name}; "
             f"exec {sys.executable} -c \"$0\" {mode}")
    proc = subprocess.Popen(["setsid", "-w", "/bin/sh", "-c", inner, program])
    deadline = time.monotonic() + 10
    while not (job / "pgid").exists() or len(tree(job)) < 2:
        assert time.monotonic() < deadline, "fake job did not start"
        time.sleep(0.05)
    return proc


def tree(job: Path) -> set[int]:
    """PIDs of the job: its process group and all descendants (via ps, independently)."""
    pgid = int((job / "pgid").read_text())
    rows = [line.split() for line in subprocess.run(
        ["ps", "-eo", "pid=,ppid=,pgid=,stat="], capture_output=True,
        text=True).stdout.splitlines()]
    live = {int(r[0]) for r in rows if int(r[2]) == pgid and not r[3].startswith("Z")}
    grew = True
    while grew:
        grew = False
        for r in rows:
            if int(r[1]) in live and int(r[0]) not in live and not r[3].startswith("Z"):
                live.add(int(r[0]))
                grew = True
    return live


def stop(job: Path, grace: float) -> dict:
    """The node package's stop as the node runs it (`node.py stop`): HOME/<jobs dir>/<run>."""
    out = subprocess.run([sys.executable, "-m", "orchestrator.node", "stop", job.parent.name,
                          job.name, str(grace)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "HOME": str(job.parent.parent)})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_stop_kills_whole_tree_and_spares_other_job(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    a = start_job(jobs / "run-a", "stubborn")
    b = start_job(jobs / "run-b", "polite")
    try:
        a_pids, b_pids = tree(jobs / "run-a"), tree(jobs / "run-b")
        # The "torchrun" (group leader) and its worker, which is in a session of its own:
        # signalling the process group alone would miss the worker.
        pgid = int((jobs / "run-a" / "pgid").read_text())
        assert len(a_pids) == 2 and any(os.getpgid(p) != pgid for p in a_pids)
        started = time.monotonic()
        result = stop(jobs / "run-a", grace=1.0)
        assert result["found"] and set(result["initial"]) == a_pids
        assert result["left"] == []
        assert result["killed"], "the SIGTERM-ignoring job needed SIGKILL"
        assert time.monotonic() - started < 10
        a.wait(timeout=10)
        assert not any(alive(p) for p in a_pids)
        assert all(alive(p) for p in b_pids), "stopping run A touched run B"
        result = stop(jobs / "run-b", grace=3.0)
        assert result["found"] and result["left"] == []
        b.wait(timeout=10)
        assert not any(alive(p) for p in b_pids)
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.kill()


def test_a_torchrun_whose_workers_ended_is_not_waited_for(tmp_path: Path) -> None:
    """The grace is for the workers (the script's own end); torchrun, alone once they
    ended, is killed a moment later instead of at the grace's end, and not counted as a
    process that needed SIGKILL."""
    job = tmp_path / "jobs" / "run-l"
    proc = start_job(job, "lingering", program=LINGERING)
    try:
        pids = tree(job)
        started = time.monotonic()
        result = stop(job, grace=30.0)
        took = time.monotonic() - started
        assert result["found"] and set(result["initial"]) == pids
        assert (result["killed"], result["left"]) == ([], [])
        assert took < 10, f"the stop waited {took:.1f} s for a torchrun whose workers ended"
        proc.wait(timeout=10)
        assert not any(alive(p) for p in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in tree(job):
            os.kill(p, 9)


def test_stop_without_job_record(tmp_path: Path) -> None:
    result = stop(tmp_path / "jobs" / "never-started", grace=1.0)
    assert (result["found"], result["killed"], result["left"]) == (False, [], [])


def test_stale_record_signals_nothing(tmp_path: Path) -> None:
    """The recorded group is now a process of something else (the PID was reused): the
    stop must leave it alone."""
    other = start_job(tmp_path / "jobs" / "run-old", "polite", run_id="someone-else")
    try:
        pids = tree(tmp_path / "jobs" / "run-old")
        result = stop(tmp_path / "jobs" / "run-old", grace=1.0)
        assert result["stale"] and result["killed"] == [] and result["initial"] == []
        time.sleep(0.3)
        assert all(alive(p) for p in pids), "a stale record signalled an unrelated process"
    finally:
        other.kill()
        for p in tree(tmp_path / "jobs" / "run-old"):
            os.kill(p, 9)


def test_a_stop_during_the_launch_waits_for_the_job_to_start_and_stops_it(tmp_path: Path) -> None:
    """The launch has started the supervisor (its pid recorded) but torchrun's group is
    not recorded yet, as when another node's launch fails a moment later: the stop waits
    for the group and stops it, instead of finding "no job" and leaving it to run."""
    job = tmp_path / "jobs" / "run-s"
    job.mkdir(parents=True)
    inner = f"sleep 1; echo $$ > {job}/pgid; exec {sys.executable} -c \"$0\" polite"
    starting = subprocess.Popen(["setsid", "-w", "/bin/sh", "-c", inner, WORKER],
                                env={**os.environ, "CLUSTERTRAIN_RUN_ID": job.name})
    (job / "supervisor.pid").write_text(f"{starting.pid}\n")
    try:
        result = stop(job, grace=2.0)
        assert result["found"] and result["initial"] and result["left"] == []
        starting.wait(timeout=10)
        assert not tree(job), "the job started after the stop and kept running"
    finally:
        if starting.poll() is None:
            starting.kill()
