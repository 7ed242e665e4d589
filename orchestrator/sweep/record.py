"""A sweep's record: RUNS_DIR/SWEEP_ID/sweep.json, beside its trials' runs (SWEEP_ID.t1,
SWEEP_ID.t2, ...: ordinary runs, each with its own record). Written whole on every change
(a reader never sees half of it), readable by its owner only, as a run's record is.

One trial is one line of the sweep: its number, its parameters, the run that tried it
last (a resumed trial runs again under a new id: SWEEP_ID.t3.2), its state and its metric.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..record.rundir import RUN_ID, new_run_id, write_private
from .early import EarlyStop
from .spec import SweepSpec, Trial

SWEEP_JSON = "sweep.json"
STOP = "stop-requested"   # beside sweep.json: `sweep stop` asked the sweep to end


class TrialState(str, Enum):
    PENDING = "pending"        # not started yet
    RUNNING = "running"        # its run was started (or waits in Slurm's queue)
    SUCCEEDED = "succeeded"
    FAILED = "failed"          # its run failed (or hung, or was refused at the door)
    STOPPED = "stopped"        # stopped with the sweep (Ctrl-C, `sweep stop`) or by `stop`
    EARLY = "stopped early"    # stopped by early_stop: worse than the others (early.py)
    NOT_RUN = "not run"        # the sweep ended before it started

    @property
    def done(self) -> bool:
        return self not in (TrialState.PENDING, TrialState.RUNNING)

    @property
    def finished(self) -> bool:
        """Nothing left to run of it (`resume` runs the others again)."""
        return self in (TrialState.SUCCEEDED, TrialState.EARLY)


@dataclass
class TrialRecord:
    number: int
    values: list[tuple[str, str]]          # (option, value) in the sweep file's order
    run_id: str | None = None              # the run that tried it last
    tries: int = 0
    state: TrialState = TrialState.PENDING
    nodes: list[str] = field(default_factory=list)
    started: float | None = None
    ended: float | None = None
    metric: float | None = None
    why: str = ""                          # a failed or stopped trial: what its run said
    loss: float | None = None              # a running trial's latest loss (its beats')

    @property
    def args(self) -> list[str]:
        return [word for pair in self.values for word in pair]

    @property
    def duration(self) -> float | None:
        return self.ended - self.started if self.started and self.ended else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "state": self.state.value,
                "values": [list(v) for v in self.values]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialRecord:
        return cls(**{**data, "state": TrialState(data["state"]),
                      "values": [tuple(v) for v in data["values"]]})


@dataclass
class SweepRecord:
    sweep_id: str
    runs_dir: Path
    file: str                               # the sweep file it was read from
    metric: str
    goal: str
    parallel: int
    max_failures: int
    created: float
    trials: list[TrialRecord]
    state: str = "starting"                 # then running, then ended, failed or stopped
    why: str = ""
    host: str = ""                          # where the sweep runs (runs, or ran last)
    pid: int = 0
    early_stop: EarlyStop | None = None

    @property
    def path(self) -> Path:
        return self.runs_dir / self.sweep_id

    def trial_run_id(self, trial: TrialRecord) -> str:
        """The id of TRIAL's next run: SWEEP.tN first, SWEEP.tN.K for its K-th try."""
        base = f"{self.sweep_id}.t{trial.number}"
        return base if trial.tries == 0 else f"{base}.{trial.tries + 1}"

    def save(self) -> None:
        data = {"sweep_id": self.sweep_id, "file": self.file, "metric": self.metric,
                "goal": self.goal, "parallel": self.parallel,
                "max_failures": self.max_failures, "created": self.created,
                "state": self.state, "why": self.why, "host": self.host, "pid": self.pid,
                "early_stop": asdict(self.early_stop) if self.early_stop else None,
                "trials": [t.to_json() for t in self.trials]}
        write_private(self.path / SWEEP_JSON, json.dumps(data, indent=1) + "\n")

    @property
    def stop_requested(self) -> bool:
        return (self.path / STOP).exists()

    def tally(self) -> str:
        """How many trials are in each state, in the order first met: `3 succeeded, 1 failed`."""
        counts: dict[str, int] = {}
        for t in self.trials:
            counts[t.state.value] = counts.get(t.state.value, 0) + 1
        return ", ".join(f"{n} {state}" for state, n in counts.items())

    def ranked(self) -> list[TrialRecord]:
        """The trials best first by the metric (the goal's way), those without it after,
        in their order."""
        sign = 1.0 if self.goal == "minimize" else -1.0
        with_metric = sorted((t for t in self.trials if t.metric is not None),
                             key=lambda t: sign * (t.metric or 0.0))
        return with_metric + [t for t in self.trials if t.metric is None]


def new_sweep(runs_dir: Path, file: Path, sweep: SweepSpec, trials: list[Trial],
              parallel: int) -> SweepRecord:
    """A new sweep's record, written: every trial pending."""
    record = SweepRecord(new_run_id(), runs_dir, str(file), sweep.metric, sweep.goal,
                         parallel, sweep.max_failures, time.time(),
                         [TrialRecord(t.number, list(t.values)) for t in trials],
                         early_stop=sweep.early_stop)
    record.path.mkdir(parents=True, mode=0o700)
    record.save()
    return record


def open_sweep(runs_dir: Path, sweep_id: str) -> SweepRecord:
    """The record of SWEEP_ID; InputError naming the sweeps there when it is not one."""
    path = runs_dir / sweep_id / SWEEP_JSON
    if not RUN_ID.match(sweep_id) or not path.is_file():
        known = ", ".join(p.parent.name for p in sorted(runs_dir.glob(f"*/{SWEEP_JSON}"))[-5:])
        raise InputError(f"no sweep {sweep_id!r} in {runs_dir}/ (recent: {known or 'none'}); "
                         "pass --runs-dir where it was started")
    data = json.loads(path.read_text(encoding="utf-8"))
    trials = [TrialRecord.from_json(t) for t in data.pop("trials")]
    early = data.pop("early_stop", None)
    return SweepRecord(runs_dir=runs_dir, trials=trials,
                       early_stop=EarlyStop(**early) if early else None, **data)
