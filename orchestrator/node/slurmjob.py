"""The Slurm job a run holds (`train --queue`), as a node's supervisor sees it (standard
library only). The supervisor's environment carries its id (JOB_ENV; the ranks see
SLURM_JOB_ID too) when the run has one.

- While the run runs, the job is watched: once Slurm ends it (`scancel` by anyone, its
  time limit), the run ends on this node too: no rank goes on using GPUs that Slurm
  has given to someone else.
- When the run ends, its job ends, once every peer has ended (or PEERS_END_WAIT passed):
  COMPLETED in Slurm's accounting if the run succeeded, FAILED if it failed, cancelled if
  it was stopped (`outcome`, read from every node's state). A detached run (`train --queue
  --detach`) gives its GPUs back without its `train`; for an attached one, whose `train`
  ends it too, this is a no-op.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable

JOB_ENV = "CLUSTERTRAIN_SLURM_JOB"   # a reserved name: a job's --env cannot set it
LOOK = 10.0            # seconds between two looks at the job while the run runs
PEERS_END_WAIT = 60.0  # at most this long for the peers to end before the job is cancelled
END_WAIT = 15.0        # ... and for the job to end once told how its run ended
# A node's end reasons (protocol.End) of a run that was stopped, not ended by itself.
STOPPED = frozenset({"stopped", "controller-lost", "peer-stopped"})
# squeue's states of a job that holds its nodes no more.
_OVER = frozenset({"COMPLETING", "COMPLETED", "CANCELLED", "TIMEOUT", "FAILED", "NODE_FAIL",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED"})


def ended_why(job: str) -> str:
    """Why a run whose job Slurm ended stopped, in its record."""
    return f"its Slurm job {job} ended (scancel, or its time limit)"


def job_id() -> str | None:
    return os.environ.get(JOB_ENV) or None


def job_state(job: str, timeout: float = 20.0) -> str | None:
    """JOB's state as squeue says it ('' once Slurm has forgotten it: MinJobAge), None
    when Slurm does not answer (slurmctld restarting): no answer, not an end."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                             text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 and "invalid job id" not in out.stderr.lower():
        return None
    words = out.stdout.split()
    return words[0] if words else ""


def ended(job: str, timeout: float = 20.0) -> bool:
    """Whether Slurm says JOB is over. A controller that does not answer is no answer:
    False (the run is not stopped for a moment's silence of slurmctld)."""
    state = job_state(job, timeout)
    return state is not None and (not state or state in _OVER)


class Watch:
    """Looks at JOB now and every LOOK seconds in a thread of its own (squeue may take long: the
    heartbeat must not wait for it); `over` is set once Slurm has ended the job."""

    def __init__(self, job: str, look: float = LOOK,
                 is_over: Callable[[str], bool] = ended) -> None:
        self.job, self.over = job, threading.Event()
        self._done = threading.Event()
        self._look, self._is_over = look, is_over
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while True:   # the first look at once: a job cancelled during the launch counts
            if self._is_over(self.job):
                self.over.set()
                return
            if self._done.wait(self._look):
                return

    def look_now(self) -> bool:
        """Whether the job is over, looking once more now (the thread looks every LOOK s)."""
        if not self.over.is_set() and self._is_over(self.job):
            self.over.set()
        return self.over.is_set()

    def close(self) -> None:
        self._done.set()


def outcome(states: list[dict | None]) -> int | None:
    """How a run ended, from its nodes' STATES (as their supervisors wrote them): 0 every
    node's torchrun exited with 0, 1 a node failed (or was lost), None it was stopped (a
    stop, Ctrl-C, its train gone) or a state is missing: its job is cancelled then."""
    ended = [s for s in states if s and s.get("state") == "ended"]
    if len(ended) < len(states):
        return None
    reasons = {str(s.get("reason")) for s in ended}
    if reasons & STOPPED:
        return None
    return 0 if reasons == {"exited"} and all(s.get("code") == 0 for s in ended) else 1


def end_job(job: str, code: int | None, wait: float | None = None,
            is_over: Callable[[str], bool] = ended) -> bool:
    """End JOB as its run ended: CODE 0 (succeeded) makes it COMPLETED, another code
    FAILED (the holding batch script leaves with 0 on SIGUSR1, 1 on SIGUSR2); whether the
    job ended so within WAIT seconds. A job with no such script (submitted by an older
    version) does not: its caller cancels it."""
    if code is None:
        return False
    signal_name = "USR1" if code == 0 else "USR2"
    try:
        done = subprocess.run(["scancel", "--batch", f"--signal={signal_name}", job],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if done.returncode != 0:
        return False
    # a job still held after WAIT (END_WAIT) is cancelled after all
    deadline = time.monotonic() + (END_WAIT if wait is None else wait)
    while not is_over(job):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def release(job: str, peers_ended: Callable[[], bool],
            ended_as: Callable[[], int | None] = lambda: None,
            wait: float = PEERS_END_WAIT) -> None:
    """End JOB once PEERS_ENDED() says every peer's part has ended (a node still writing
    its last checkpoint keeps its GPUs), or WAIT seconds passed (a peer that died never
    says so): as the run ended (ENDED_AS: 0 succeeded, 1 failed; end_job makes the job
    COMPLETED or FAILED), else cancelled. Ending a job that is over does nothing."""
    deadline = time.monotonic() + wait
    while not peers_ended() and time.monotonic() < deadline:
        time.sleep(1.0)
    if end_job(job, ended_as()):
        return
    try:
        subprocess.run(["scancel", job], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass
