"""What the soak reads back from the cluster's own records, as history.py's data: a run's
summary as `RunSeen` (its times on the soak's clock, what its user was shown, the
checkpoints it reported saved) and the GPUs it held as `Hold`s.

The soak adds what only it knows: the end states its history allows, whether the run was
allowed to recover, and whose actions touched it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime

from orchestrator.record.summary import NOT_STARTED, Summary

from .history import Hold, RunSeen

# The project's job (train/train.py) says each checkpoint it saved, with its path.
SAVED = re.compile(r"\bcheckpoint (?P<path>/\S+) \(\d+(?:\.\d+)?s\)")


def on_clock(iso: str | None, t0: float) -> float | None:
    """An ISO time of a record as seconds since T0 (the soak's start, in epoch seconds)."""
    return None if iso is None else datetime.fromisoformat(iso).timestamp() - t0


def saved(lines: Iterable[str]) -> tuple[str, ...]:
    """The checkpoints LINES (a run's log) say were saved, in order, each once."""
    found = [m.group("path") for line in lines for m in SAVED.finditer(line)]
    return tuple(dict.fromkeys(found))


def run_seen(summary: Summary, user: str, t0: float, shown: tuple[str, ...] = (), *,
             allowed: tuple[str, ...] = (), may_recover: bool = False,
             changed_by: tuple[str, ...] = ()) -> RunSeen:
    """SUMMARY, a run of USER's, as the invariants read it; SHOWN: what its user was shown
    of its logs (`logs RUN`, or train's own output)."""
    start = on_clock(summary.start, t0)
    return RunSeen(summary.run_id, user, summary.status.value,
                   0.0 if start is None else start, on_clock(summary.end, t0),
                   tuple(n.name for n in summary.nodes), allowed=allowed,
                   may_recover=may_recover, shown=shown, saved=saved(shown),
                   changed_by=changed_by)


def holds_of(summary: Summary, t0: float, node_gpus: Mapping[str, int]) -> list[Hold]:
    """The GPUs SUMMARY's run held, from its start to its end: on each of its nodes where
    it started, those its Slurm job was given, or every GPU the node has (NODE_GPUS: how
    many) for a run that did not come through the queue."""
    start, end = on_clock(summary.start, t0), on_clock(summary.end, t0)
    slurm = summary.info.get("slurm") or {}
    given: Mapping[str, list[int]] = slurm.get("gpus") or {}
    holds = []
    for node in summary.nodes:
        if node.end_reason == NOT_STARTED:
            continue   # refused before its launch there: it held nothing of that node
        gpus = given.get(node.name) or list(range(node_gpus.get(node.name, 0)))
        holds += [Hold("run", summary.run_id, node.name, gpu, start or 0.0, end)
                  for gpu in gpus]
    return holds
