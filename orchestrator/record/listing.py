"""A recorded run as one row of a list (`runs`, the index of `ui`): its status, nodes,
user, duration and what it ran, and a note when its record or its nodes could not be read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ClusterError
from ..node import doctor as node_doctor
from ..node.protocol import NOTEBOOK_MODULE
from .rundir import DOCTOR_SHAPE, RecordUnreadable, RunDir
from .status import row
from .summary import Summary

WHAT_WIDTH = 80  # a row shows this much of the script and its arguments


@dataclass(frozen=True)
class Listed:
    run_id: str
    status: str        # as `runs` says it: "running", "failed (node1)", "queued", "unreadable"
    nodes: str
    user: str
    duration: str
    what: str
    note: str = ""     # what could not be read or asked, and why


def describe_doctor(run: RunDir) -> str | None:
    """What `runs` says of a doctor run (its module is the doctor's): its verdict from
    doctor.json, instead of the job's long command line; None for any other run."""
    if run.info().get("script") != node_doctor.__name__:
        return None
    verdict = run.read_json("doctor.json", DOCTOR_SHAPE)
    if verdict is None:
        return "doctor (no analysis: the run did not finish)"
    named = sorted({str(s.get("node")) for s in verdict.get("suspects", [])})
    return f"doctor: suspects {', '.join(named)}" if named else "doctor: no node named"


def what(run: RunDir) -> str:
    """The run's script and arguments (cut to WHAT_WIDTH), or a doctor run's verdict."""
    info = run.info()
    if info.get("script") == NOTEBOOK_MODULE:
        return "notebook (JupyterLab)" + (" detached" if info.get("detached") else "")
    said = describe_doctor(run) or f"{info.get('script', '?')} " \
        f"{' '.join(info.get('script_args', []))}".rstrip()
    return said if len(said) <= WHAT_WIDTH else said[:WHAT_WIDTH - 3] + "..."


def listed(run: RunDir, summary_of: Callable[[RunDir], Summary | None]) -> Listed:
    """RUN's row. SUMMARY_OF: its summary, None while it runs (settle: a run whose
    controller is gone is completed from what its nodes left on the share)."""
    try:
        info = run.info()
        said = what(run)
    except RecordUnreadable as exc:
        return Listed(run.run_id, "unreadable", "-", "-", "-", "-", str(exc))
    nodes = ",".join(info["nodes"])
    user = ",".join(sorted(set((info.get("users") or {}).values()))) or "-"
    note = ""
    try:
        summary = summary_of(run)
    except RecordUnreadable as exc:
        return Listed(run.run_id, "unreadable", nodes, user, "-", said, str(exc))
    except (KeyError, TypeError) as exc:   # run.json lacks what settling it needs
        return Listed(run.run_id, "unreadable", nodes, user, "-", said,
                      f"{run.run_json} lacks {exc} (written by an older version, or edited)")
    except (ClusterError, OSError) as exc:
        summary, note = None, f"{run.run_id}: cannot ask its nodes ({exc})"
    status, duration = row(summary)
    if summary is None and info.get("queued"):
        status, nodes = "queued", f"(since {str(info['queued'].get('since', '?'))[11:19]})"
    return Listed(run.run_id, status, nodes, user, duration, said, note)
