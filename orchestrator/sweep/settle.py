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
    """RECORD as it is, unless it says running while its process is gone (killed, the
    machine restarted): then its trials' states from their runs' summaries (a trial's run
    without one may still run: its `train` is a process of its own, and stays `running`;
    one whose summary cannot be read failed, with why), its pending trials not run, and
    the sweep stopped, written so (its record and its report)."""
    if record.state != "running" or alive(record):
        return record
    for t in record.trials:
        if t.state == TrialState.RUNNING and t.run_id:
            try:
                summary = RunDir(record.runs_dir, t.run_id).summary()
            except RecordUnreadable as exc:   # it ended, with a summary that says nothing
                t.state, t.why = TrialState.FAILED, str(exc)
                continue
            if summary:
                t.state = TrialState.of_run(summary.get("status"))
        elif t.state == TrialState.PENDING:
            t.state = TrialState.NOT_RUN
    record.state, record.why = "stopped", "its process is gone"
    record.save()
    write_sweep_report(record)
    return record
