"""A run's summary.json, typed: how the run ended (`Summary`), each node's end
(`NodeSummary`) and the recoveries that led to it (`Recovery`), with the version of the
record's shape.

A summary is written by record/status.py (`write`, `cut_short`: what the rule decided) and
completed by run/ (the recovery chain, the nodes kept out) with `dataclasses.replace`; it
reaches the disk through RunDir.write_summary alone. Its JSON is the run's run.json (kept
whole in `info`: the run's id, inventory, command, ...) with the fields below over it, and
`version`. This version reads the records of the last two versions:

- 1: the records written before the version was kept (no `version` key): the same shape.
- 2: `version` kept; every field as below.

A record of a later version is refused with the fix (RecordUnreadable, record/rundir.py):
it was written by a newer clustertrain, and a field this one does not know may change what
it means.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from enum import Enum
from typing import Any

VERSION = 2
READS = (1, 2)   # the versions read: this one and the one before

# The project's job says where it resumed from (train/train.py).
RESUMED = re.compile(r"resumed from (?P<checkpoint>\S+) in (?P<load_s>[\d.]+) s: epoch "
                     r"(?P<epoch>\d+), step \d+ \(global step (?P<step>\d+)\)")


class RunStatus(str, Enum):
    """A run's status, as `runs`, `attach` and summary.json give it."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"                    # first_failed names the node
    STOPPED = "stopped"                  # Ctrl-C in train, or `stop`
    INTERRUPTED = "interrupted"          # the controller was interrupted before the end
    CONTROLLER_LOST = "controller-lost"  # an attached run whose controller went away
    HUNG = "hung"                        # no progress for --hang-timeout: diagnosed, stopped

    def __str__(self) -> str:  # the value in f-strings and tables
        return self.value


NOT_STARTED = "not-started"   # a node's end_reason where its part was never launched


class NotASummary(ValueError):
    """A summary.json whose content does not make a summary (the reader names the file)."""


@dataclass(frozen=True)
class NodeSummary:
    """One node's end, as the summary keeps it."""
    name: str
    exit_code: int | None           # torchrun's; None: none came back
    end_reason: str                 # node/protocol.py End's value, or NOT_STARTED
    why: str = ""
    nproc: int | None = None
    node_rank: int | None = None
    log: str | None = None          # the node's log in the record

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name,
                **({"node_rank": self.node_rank} if self.node_rank is not None else {}),
                **({"nproc": self.nproc} if self.nproc is not None else {}),
                "exit_code": self.exit_code, "end_reason": self.end_reason,
                **({"why": self.why} if self.why else {}),
                **({"log": self.log} if self.log else {})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeSummary:
        if not isinstance(data.get("name"), str):
            raise NotASummary(f"a node of nodes has no name: {_shown(data)}")
        code = data.get("exit_code")
        return cls(data["name"], code if isinstance(code, int) else None,
                   str(data.get("end_reason") or ""), str(data.get("why") or ""),
                   _int(data.get("nproc")), _int(data.get("node_rank")),
                   data["log"] if isinstance(data.get("log"), str) else None)


@dataclass
class Recovery:
    """One recovery from a failed node, as summary.json and `runs show` give it."""
    attempt: int                 # the attempt it started: 1, 2, ...
    failed_run: str              # the attempt that failed
    node: str
    why: str
    failed_at: str               # when the failure was seen (ISO)
    run_id: str                  # the attempt it started
    nodes: list[str]
    spare: str | None
    cordoned: bool
    last_heard_at: str | None = None      # when a lost node was last heard (ISO)
    started_at: str | None = None         # the new attempt's launch (ISO)
    training_again_at: str | None = None  # its first training step (a beat)
    down_s: float | None = None           # failed_at -> training again
    silent_s: float | None = None         # last_heard_at -> training again (a lost node)
    restart_s: float | None = None        # failed_at -> torchrun started again
    resume_s: float | None = None         # torchrun started -> first step (load included)
    load_s: float | None = None           # the checkpoint's load (the project's job)
    resumed_from: dict[str, Any] | None = None   # checkpoint, epoch, step
    steps_lost: int | None = None         # steps done after that checkpoint, done again

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Recovery:
        """A recovery as a record keeps it (run.json's `recovery`, a summary's
        `recoveries`); NotASummary naming what it lacks."""
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise NotASummary(f"a recovery is not whole ({exc}): {_shown(data)}") from None

    def completed(self, started_at: str | None, training_again_at: str | None,
                  log_text: str, last_step: int | None) -> Recovery:
        """The recovery with what the new attempt's end tells: when it was launched
        (STARTED_AT) and trained again (TRAINING_AGAIN_AT), and from which checkpoint
        (its log's LOG_TEXT). LAST_STEP: the failed attempt's last step seen (its beats)."""
        failed, heard = _time(self.failed_at), _time(self.last_heard_at)
        started, again = _time(started_at), _time(training_again_at)
        found = RESUMED.search(log_text)
        step = int(found["step"]) if found else None
        return Recovery(**{
            **asdict(self), "started_at": started_at, "training_again_at": training_again_at,
            "restart_s": _between(failed, started), "down_s": _between(failed, again),
            "resume_s": _between(started, again), "silent_s": _between(heard, again),
            **({"load_s": float(found["load_s"]),
                "resumed_from": {"checkpoint": found["checkpoint"],
                                 "epoch": int(found["epoch"]), "step": step},
                "steps_lost": max(0, last_step - step) if last_step is not None and
                step is not None else None} if found else {})})

    def line(self) -> str:
        """The recovery in one line (train's output, `runs show`)."""
        where = f"{self.spare} took its place" if self.spare else "on fewer nodes"
        told = [f"recovery {self.attempt}: {self.node} {self.why} at {self.failed_at}; "
                f"{where}, as {self.run_id} on {', '.join(self.nodes)}"]
        if self.down_s is not None:
            told.append(f"training again {self.down_s:.1f} s later" + (
                f", {self.silent_s:.1f} s after its last heartbeat"
                if self.silent_s is not None else "") + " (torchrun restarted "
                        f"after {self.restart_s:.1f} s, first step {self.resume_s:.1f} s "
                        "after that" + (f", checkpoint loaded in {self.load_s:.2f} s"
                                        if self.load_s is not None else "") + ")")
        if self.resumed_from:
            told.append(f"resumed from {self.resumed_from['checkpoint']} (epoch "
                        f"{self.resumed_from['epoch']}, step {self.resumed_from['step']}"
                        + (f", {self.steps_lost} step(s) done again"
                           if self.steps_lost is not None else "") + ")")
        return "; ".join(told)


@dataclass(frozen=True)
class Summary:
    """How a run ended: summary.json. INFO: the run's run.json as the summary keeps it
    (with any key of a later writer this version does not name)."""
    status: RunStatus
    duration_s: float
    start: str | None = None
    end: str | None = None
    nodes: tuple[NodeSummary, ...] = ()
    exit_codes: dict[str, int | None] = field(default_factory=dict)   # torchrun's, a node
    first_failed: str | None = None
    training_completed: bool | None = None   # None: not known (no markers)
    rank_exit_codes: dict[str, dict[str, int]] = field(default_factory=dict)
    error: str | None = None                 # why the run was cut short
    after_finish: dict[str, list[str]] = field(default_factory=dict)
    no_space: dict[str, str] = field(default_factory=dict)   # node -> its full place
    command: dict[str, str] = field(default_factory=dict)    # node -> its torchrun line
    hang: dict[str, Any] | None = None
    step_times: dict[str, dict[str, Any]] = field(default_factory=dict)
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    system_flags: list[dict[str, Any]] = field(default_factory=list)
    first_step_at: str | None = None
    last_step: int | None = None
    sync_s: float | None = None
    settled_from: str | None = None          # a run settled from its nodes' states
    cordoned: dict[str, str] = field(default_factory=dict)   # nodes kept out, with why
    drained: dict[str, str] = field(default_factory=dict)
    recovery_of: str | None = None           # the first attempt of a recovered run
    recovered_in: str | None = None          # the attempt that followed this one
    recoveries: tuple[Recovery, ...] = ()    # every recovery up to this attempt
    info: dict[str, Any] = field(default_factory=dict)
    version: int = VERSION

    def __post_init__(self) -> None:
        # run.json's keys that a field of the summary takes the place of (its `nodes`, the
        # names, are the nodes' ends here) are not kept twice.
        object.__setattr__(self, "info", {k: v for k, v in self.info.items()
                                          if k not in _FIELDS})

    @property
    def run_id(self) -> str:
        return str(self.info.get("run_id") or "")

    @property
    def succeeded(self) -> bool:
        return self.status == RunStatus.SUCCEEDED

    def node(self, name: str | None) -> NodeSummary | None:
        return next((n for n in self.nodes if n.name == name), None)

    def to_json(self) -> dict[str, Any]:
        """summary.json: run.json's keys, then each field (one that is empty, left out;
        those every summary has, always), and the version."""
        always = {"status", "duration_s", "start", "end", "nodes", "exit_codes",
                  "first_failed", "training_completed", "rank_exit_codes"}
        out = dict(self.info)
        for f in fields(self):
            if f.name in ("info", "version"):
                continue
            value = getattr(self, f.name)
            if f.name not in always and value in (None, {}, [], ()):
                continue
            if f.name == "nodes":
                value = [n.to_json() for n in value]
            elif f.name == "recoveries":
                value = [r.to_json() for r in value]
            elif f.name == "status":
                value = value.value
            out[f.name] = value
        out["version"] = VERSION
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Summary:
        """A summary of a version this one reads (READS); NotASummary naming what is
        wrong. The shape of each key is checked first by the reader (record/rundir.py)."""
        version = data.get("version", 1)
        if version not in READS:
            raise NotASummary(
                f"its version is {_shown(version)}: this clustertrain reads versions "
                f"{READS[0]} and {READS[-1]} (a newer one wrote it); read it with that one")
        try:
            status = RunStatus(data["status"])
        except (KeyError, ValueError):
            raise NotASummary(f"status is {_shown(data.get('status'))}, not one of "
                              f"{', '.join(s.value for s in RunStatus)}") from None
        duration = data.get("duration_s")
        if not isinstance(duration, (int, float)) or isinstance(duration, bool):
            raise NotASummary(f"duration_s is {_shown(duration)}, not a number")
        named = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: v for k, v in data.items()
                                  if k in named and k not in ("info", "version")}
        values["status"], values["duration_s"] = status, float(duration)
        values["nodes"] = tuple(NodeSummary.from_json(n) for n in data.get("nodes") or []
                                if isinstance(n, Mapping))
        values["recoveries"] = tuple(Recovery.from_json(r) for r in data.get("recoveries")
                                     or [])
        # A null where the field has no null of its own (a list, a mapping): its empty one.
        for f in fields(cls):
            if f.name in values and values[f.name] is None and f.default is not None:
                del values[f.name]
        info = {k: v for k, v in data.items() if k not in named}
        return cls(**values, info=info, version=int(version))


_FIELDS = frozenset(f.name for f in fields(Summary))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _time(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def _between(start: float | None, end: float | None) -> float | None:
    return round(end - start, 3) if start is not None and end is not None else None


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
