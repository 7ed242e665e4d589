"""Whether a sweep still runs, and the record of one whose process is gone: the rule that
`sweep show`, `sweep stop`, `sweep resume` and the web view (`ui`) all read a sweep by, so
that none shows a dead sweep as running while another says it stopped."""

from __future__ import annotations

import os
import socket

from ..record.rundir import RecordUnreadable, RunDir
from .record import SweepRecord, TrialState
from .report import write_sweep_report


def alive(record: SweepRecord) -> bool:
    """Whether the sweep's own process still runs it (on this machine)."""
    if record.state != "running" or record.host != socket.gethostname() or not record.pid:
        return False
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def settle(record: SweepRecord) -> SweepRecord:
    """RECORD as it is while its process runs it. Once that process is gone (killed, the
    machine restarted) while the record says running: the sweep stopped, its pending
    trials not run. And whenever it is gone, each trial still `running` takes its run's
    end from the run's summary, as soon as there is one: a trial's `train` is a process of
    its own, which may end long after the sweep's (one whose summary cannot be read
    failed, with why). What changed is written (its record and its report)."""
    if record.state not in ("running", "stopped") or alive(record):
        return record
    changed = record.state == "running"
    for t in record.trials:
        if t.state == TrialState.RUNNING and t.run_id:
            try:
                summary = RunDir(record.runs_dir, t.run_id).summary()
            except RecordUnreadable as exc:   # it ended, with a summary that says nothing
                t.state, t.why, changed = TrialState.FAILED, str(exc), True
                continue
            if summary:
                t.state, changed = TrialState.of_run(summary.status), True
        elif t.state == TrialState.PENDING and record.state == "running":
            t.state = TrialState.NOT_RUN
    if not changed:
        return record
    if record.state == "running":
        record.state, record.why = "stopped", "its process is gone"
    record.save()
    write_sweep_report(record)
    return record
