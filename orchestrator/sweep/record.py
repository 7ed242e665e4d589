"""A sweep's record: RUNS_DIR/SWEEP_ID/sweep.json, beside its trials' runs (SWEEP_ID.t1,
SWEEP_ID.t2, ...: ordinary runs, each with its own record). Written whole on every change
(a reader never sees half of it), readable by its owner only, as a run's record is.

One trial is one line of the sweep: its number, its parameters, the run that tried it
last (a resumed trial runs again under a new id: SWEEP_ID.t3.2), its state and its metric.
"""

from __future__ import annotations

import json
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..record.rundir import RUN_ID, RecordUnreadable, new_run_id, write_private
from .early import EarlyStop
from .sweepfile import SweepSpec, Trial

SWEEP_JSON = "sweep.json"
STOP = "stop-requested"   # beside sweep.json: `sweep stop` asked the sweep to end


class SweepUnreadable(RecordUnreadable):
    """A sweep's sweep.json cannot be read (cut short, edited, not JSON, not a sweep's)."""


class _Wrong(ValueError):
    """What is wrong with a sweep.json's content (open_sweep says where, and the fix)."""


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

    @classmethod
    def of_run(cls, status: object) -> TrialState:
        """The state of a trial whose run ended with STATUS (its summary's): succeeded,
        stopped (stopped or interrupted), else failed."""
        return {"succeeded": cls.SUCCEEDED, "stopped": cls.STOPPED,
                "interrupted": cls.STOPPED}.get(str(status), cls.FAILED)


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
    def from_json(cls, data: Any, label: str = "a trial") -> TrialRecord:
        """The trial DATA holds; _Wrong (naming LABEL) for what no writer of it writes."""
        if not isinstance(data, dict):
            raise _Wrong(f"{label} is not a JSON object")
        _check_keys(cls, data, label)
        state = data.get("state", TrialState.PENDING.value)
        try:
            state = TrialState(state)
        except ValueError:
            raise _Wrong(f"{label}: state {state!r} is not one of "
                         f"{', '.join(s.value for s in TrialState)}") from None
        try:
            return cls(**{**data, "state": state,
                          "values": [tuple(v) for v in data["values"]]})
        except TypeError as exc:
            raise _Wrong(f"{label}: values {data['values']!r} are not (option, value) pairs "
                         f"({exc})") from None


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
    if not RUN_ID.fullmatch(sweep_id) or not path.is_file():
        known = ", ".join(p.parent.name for p in sorted(runs_dir.glob(f"*/{SWEEP_JSON}"))[-5:])
        raise InputError(f"no sweep {sweep_id!r} in {runs_dir}/ (recent: {known or 'none'}); "
                         "pass --runs-dir where it was started")
    try:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise _Wrong(f"cannot be read ({exc.strerror or exc})") from None
        except ValueError as exc:   # not UTF-8, not JSON
            raise _Wrong(f"is not JSON ({exc}): it was cut short or edited") from None
        return _sweep_record(runs_dir, data)
    except _Wrong as exc:
        raise SweepUnreadable(
            f"sweep {sweep_id}: {path} {exc}; restore the file, or remove the sweep's "
            f"directory {path.parent}/ if you no longer need the sweep (its trials' runs "
            "stay)") from None


def _sweep_record(runs_dir: Path, data: Any) -> SweepRecord:
    """The sweep DATA (a sweep.json's) holds; _Wrong for what no writer of it writes."""
    if not isinstance(data, dict):
        raise _Wrong(f"is not a JSON object (it holds {type(data).__name__})")
    _check_keys(SweepRecord, data, "", skip=("runs_dir",))
    if not isinstance(data["trials"], list):
        raise _Wrong("trials is not a list")
    trials = [TrialRecord.from_json(t, f"trial {i}") for i, t in enumerate(data["trials"], 1)]
    early = data.get("early_stop")
    if early:
        if not isinstance(early, dict):
            raise _Wrong(f"early_stop {early!r} is not a JSON object")
        _check_keys(EarlyStop, early, "its early_stop")
    return SweepRecord(**{**data, "runs_dir": runs_dir, "trials": trials,
                          "early_stop": EarlyStop(**early) if early else None})


def _check_keys(cls: type, data: dict[str, Any], label: str, skip: tuple[str, ...] = ()) -> None:
    """_Wrong (naming LABEL, if any) when DATA lacks a field of CLS that has no default, or
    has a key CLS has no field for."""
    known = [f for f in fields(cls) if f.name not in skip]
    missing = [f.name for f in known if f.name not in data and f.default is MISSING
               and f.default_factory is MISSING]
    if missing:
        raise _Wrong(f"{label} lacks {', '.join(missing)} (written by another version, or "
                     "edited)".lstrip())
    unknown = sorted(set(data) - {f.name for f in known})
    if unknown:
        raise _Wrong(f"{label} has an unknown key {unknown[0]!r} (written by another "
                     "version, or edited)".lstrip())
