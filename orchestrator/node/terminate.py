"""Stop one run's processes on this node: its torchrun's process group and every
descendant of it, SIGTERM then SIGKILL after a grace period; never by name, never a
process that does not carry the run's id (a stale record whose PID was reused).

The one way to stop a run, used by the supervisor itself (a peer failed, a hang, the
controller gone), by `train` (Ctrl-C, a failure elsewhere) and by `stop RUN`.
"""

from __future__ import annotations

import getpass
import os
import signal
import time

from .protocol import (
    OUTPUT_LOG,
    PGID_FILE,
    RUN_ID_ENV,
    STOP_MARKER,
    STOP_REQUESTED,
    STOPPED_FILE,
    SUPERVISOR_PID,
)
from .util import environ, process_table, read_pid


class Tree:
    """A process group and every descendant of it, also those that left the group
    (torchrun starts its workers in sessions of their own) or were re-parented."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.seen: set[int] = set()

    def members(self) -> set[int]:
        procs = process_table()
        live = {p for p, proc in procs.items() if proc.pgrp == self.pgid and proc.state != "Z"}
        grew = True
        while grew:
            grew = False
            for p, proc in procs.items():
                if proc.ppid in live and p not in live and proc.state != "Z":
                    live.add(p)
                    grew = True
        live |= {p for p in self.seen if p in procs and procs[p].state != "Z"}
        self.seen |= live
        return live


def belongs(pid: int | None, run_id: str) -> bool:
    """Whether PID carries the run's id in its environment (not a reused PID)."""
    return pid is not None and environ(pid).get(RUN_ID_ENV) == run_id


# A supervisor launched a moment ago starts torchrun and records its group within this.
STARTING = 10.0
# After the SIGKILL, the killed processes' end is waited for this long (a busy node).
STOP_SETTLE = 5.0
# torchrun alone, its workers ended: this long to copy their last output into the log, then
# SIGKILL. The rest of its end is the interpreter's teardown of torch, worth nothing here
# and seconds long on a loaded node (64 sandbox nodes on two cores: every torchrun outlived
# the 5 s grace that way).
LEADER_ALONE = 1.0


def _await_end(tree: Tree, grace: float) -> bool:
    """Until every process of TREE ended, GRACE seconds passed, or the group's leader
    (torchrun) has been alone for LEADER_ALONE since its workers ended; whether the last."""
    deadline = time.monotonic() + grace
    alone_since: float | None = None
    while time.monotonic() < deadline:
        live = tree.members()
        if not live:
            return False
        if live == {tree.pgid} and tree.seen != live:
            alone_since = alone_since or time.monotonic()
            if time.monotonic() - alone_since >= LEADER_ALONE:
                return True
        else:
            alone_since = None   # a worker again: the moment starts over when it ends
        time.sleep(0.1)
    return False


def _mark_output(job: str) -> None:
    """STOP_MARKER as a line of the run's output, before its processes hear of the stop
    (the output is appended to: the line cannot land inside another write)."""
    path = os.path.join(job, OUTPUT_LOG)
    if not os.path.exists(path):
        return
    try:
        with open(path, "a") as fh:
            fh.write(f"{STOP_MARKER}\n")
    except OSError:   # a full disk: the stop matters more than its mark
        pass


def stop_tree(job: str, run_id: str, grace: float) -> dict:
    """Stop the run whose torchrun recorded its process group in JOB/pgid. A run whose
    supervisor has been launched but has not started torchrun yet is stopped too: asked
    first, it never starts torchrun; a moment late, it records the group, which is then
    stopped here."""
    me = getpass.getuser()
    pgid = read_pid(os.path.join(job, PGID_FILE))
    supervisor = read_pid(os.path.join(job, SUPERVISOR_PID))
    starting = pgid is None and supervisor is not None and belongs(supervisor, run_id)
    if pgid is None and not starting:
        return {"found": False, "user": me, "killed": [], "left": []}
    with open(os.path.join(job, STOP_REQUESTED), "a") as fh:
        fh.write(f"{time.time()}\n")
    deadline = time.monotonic() + STARTING
    while pgid is None and belongs(supervisor, run_id) and time.monotonic() < deadline:
        time.sleep(0.05)
        pgid = read_pid(os.path.join(job, PGID_FILE))
    if pgid is None:  # it ended before starting torchrun (or is stuck: say so)
        left = [supervisor] if belongs(supervisor, run_id) else []
        return {"found": True, "user": me, "initial": left, "killed": [], "left": left}
    tree = Tree(pgid)
    start = tree.members()
    if start and not any(belongs(p, run_id) for p in start):
        # The PID was reused by something that is not this run: signal nothing.
        return {"found": True, "user": me, "pgid": pgid, "initial": [], "killed": [],
                "left": [], "stale": True}
    _mark_output(job)
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    alone = _await_end(tree, grace)
    survivors = tree.members()
    # torchrun alone once its workers ended is no process that needed SIGKILL
    killed = [] if alone else sorted(survivors)
    for p in survivors:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + STOP_SETTLE
    while tree.members() and time.monotonic() < deadline:
        time.sleep(0.1)
    with open(os.path.join(job, STOPPED_FILE), "w") as fh:
        fh.write(str(time.time()))
    return {"found": True, "user": me, "pgid": pgid, "initial": sorted(start),
            "killed": killed, "left": sorted(tree.members())}
