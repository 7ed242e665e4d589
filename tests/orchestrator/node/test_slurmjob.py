"""node/slurmjob.py: what a supervisor makes of its run's Slurm job. squeue and scancel
here are test doubles (small scripts on PATH that print what Slurm 22.05 prints); the real
path runs in tests/orchestrator/run/test_queue_sandbox.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.node import slurmjob


def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, script: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


@pytest.mark.parametrize(("script", "over"), [
    ("echo RUNNING\n", False),
    ("echo COMPLETING\n", True),
    ("echo CANCELLED\n", True),
    ("echo TIMEOUT\n", True),
    ("", True),   # no longer listed
    ("echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1\n", True),
    ("echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1\n", False),
])
def test_a_job_is_over_only_when_slurm_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               script: str, over: bool) -> None:
    fake(tmp_path, monkeypatch, "squeue", script)
    assert slurmjob.ended("42") is over


def test_no_squeue_is_no_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert slurmjob.ended("42") is False


def test_the_watch_says_over_once_the_job_is_over() -> None:
    looks: list[str] = []

    def is_over(job: str) -> bool:
        looks.append(job)
        return len(looks) >= 3

    watch = slurmjob.Watch("7", look=0.02, is_over=is_over)
    assert watch.over.wait(5)
    assert looks == ["7", "7", "7"]
    watch.close()


def test_release_waits_for_the_peers_then_cancels(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "scancel.log"
    fake(tmp_path, monkeypatch, "scancel", f'echo "$@" >> {log}\n')
    ends = iter([False, False, True])
    started = time.monotonic()
    slurmjob.release("9", lambda: next(ends), wait=30)
    assert 1.5 < time.monotonic() - started < 10
    assert log.read_text() == "9\n"


def test_release_does_not_wait_for_a_peer_that_never_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "scancel.log"
    fake(tmp_path, monkeypatch, "scancel", f'echo "$@" >> {log}\n')
    started = time.monotonic()
    slurmjob.release("9", lambda: False, wait=1.5)
    assert time.monotonic() - started < 5
    assert log.read_text() == "9\n"


def _ended(reason: str = "exited", code: int = 0) -> dict:
    return {"state": "ended", "reason": reason, "code": code}


@pytest.mark.parametrize(("states", "outcome"), [
    ([_ended(), _ended()], 0),                                      # succeeded
    ([_ended(code=3), _ended("peer-failed", -15)], 1),              # a node failed
    ([_ended("peer-lost", -15), _ended()], 1),                      # a node was lost
    ([_ended("hung", -15), _ended("hung", -15)], 1),
    ([_ended("stopped", -2), _ended("peer-stopped", -15)], None),   # stop, Ctrl-C
    ([_ended("controller-lost", -15), _ended()], None),             # its train went away
    ([_ended(), {"state": "running"}], None),                       # not every part ended
    ([_ended(), None], None),                                       # a state not read
])
def test_how_the_run_ended_by_its_nodes_states(states: list, outcome: int | None) -> None:
    assert slurmjob.outcome(states) == outcome


@pytest.mark.parametrize(("ended_as", "said"), [
    (0, "--batch --signal=USR1 9\n"), (1, "--batch --signal=USR2 9\n"), (None, "9\n")])
def test_release_ends_the_job_as_the_run_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ended_as: int | None,
        said: str) -> None:
    """Succeeded or failed: the job's holding script is told (COMPLETED or FAILED in
    sacct); stopped or unknown: the job is cancelled."""
    log = tmp_path / "scancel.log"
    fake(tmp_path, monkeypatch, "scancel", f'echo "$@" >> {log}\n')
    fake(tmp_path, monkeypatch, "squeue", f'[ -e {log} ] || echo RUNNING\n')
    slurmjob.release("9", lambda: True, lambda: ended_as, wait=5)
    assert log.read_text() == said


def test_a_job_that_goes_on_after_it_was_told_is_cancelled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Told how its run ended, a job that squeue still lists END_WAIT later (its script
    did not leave) is cancelled: no run's GPUs are held after it."""
    log = tmp_path / "scancel.log"
    fake(tmp_path, monkeypatch, "scancel", f'echo "$@" >> {log}\n')
    fake(tmp_path, monkeypatch, "squeue", "echo RUNNING\n")
    monkeypatch.setattr(slurmjob, "END_WAIT", 1.0)
    assert slurmjob.end_job("9", 0, wait=1.0) is False
    slurmjob.release("9", lambda: True, lambda: 0, wait=5)
    assert log.read_text().splitlines()[-2:] == ["--batch --signal=USR1 9", "9"]


def test_a_job_that_cannot_be_told_is_cancelled(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A job with no batch script (submitted by an older version): scancel --batch fails,
    and the job is cancelled."""
    log = tmp_path / "scancel.log"
    fake(tmp_path, monkeypatch, "scancel",
         f'echo "$@" >> {log}\ncase "$1" in --batch) exit 1;; esac\n')
    slurmjob.release("9", lambda: True, lambda: 0, wait=5)
    assert log.read_text() == "--batch --signal=USR1 9\n9\n"


def test_a_look_now_sees_a_job_that_ended_between_two_looks() -> None:
    """A supervisor whose ranks failed looks at the job once more before it names the end:
    a job cancelled since the watch's last look is seen now (the run stopped; it did not
    fail)."""
    over = [False]
    watch = slurmjob.Watch("8", look=3600, is_over=lambda job: over[0])
    time.sleep(0.1)   # the watch's first look: not over
    assert not watch.over.is_set()
    over[0] = True    # scancel, between two looks
    assert watch.look_now() and watch.over.is_set()
    watch.close()
