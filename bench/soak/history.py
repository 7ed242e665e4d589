"""What a soak saw, as data the invariants read (Jepsen's way: a history of what the
workload and the nemesis did, then what the cluster's records say, checked against each
other).

- `Event`: one line of the history: an action of a user or a fault of the nemesis, when it
  began and how it ended (`kind`: invoke, ok, fail, info for the workload; fault and heal
  for the nemesis).
- `RunSeen`: a run's record as the soak read it at the end, with what the soak expects of
  it from what it did (`allowed`: the end states that match its history).
- `Hold`: a GPU held by an owner for a time, as a run's record says or Slurm's accounting
  (`source`).
- `ProcessSeen`: a process of a run found on a node at a moment.
- `Sample`: the memory, open files and threads of a long-lived process at a moment, or the
  bytes of the share's records (`what`).
- `Cordon`: a node kept out at the end, and its reason.
- `Attack`: what the pushing user tried against another user, and what it got (nothing:
  it was refused).
- `Violation`: an invariant broken, with its evidence and the time it names; `around`
  gives the history near that time, so that the report shows the seed, the actions and
  the faults a person needs to reproduce it.

Standard library only: the soak's report and its tests read these without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WORKLOAD_KINDS = ("invoke", "ok", "fail", "info")
NEMESIS_KINDS = ("fault", "heal")


@dataclass(frozen=True)
class Event:
    t: float            # seconds since the soak began
    actor: str          # a user's name, or "nemesis"
    kind: str           # WORKLOAD_KINDS or NEMESIS_KINDS
    what: str           # the verb or the fault: "train --detach", "kill-node", ...
    args: dict[str, Any] = field(default_factory=dict)
    result: str = ""    # what it said, shortened (ok, fail, info)

    def line(self) -> str:
        said = f" -> {self.result}" if self.result else ""
        args = " ".join(f"{k}={v}" for k, v in sorted(self.args.items()))
        return f"{self.t:9.1f} s  {self.actor:<8} {self.kind:<6} {self.what} {args}{said}"


@dataclass(frozen=True)
class RunSeen:
    run_id: str
    user: str
    status: str                      # the record's end state ("running": none)
    start: float
    end: float | None                # None: the record has no end
    nodes: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()    # the end states its history allows (empty: any)
    may_recover: bool = False        # it was allowed to recover (--max-recoveries)
    shown: tuple[str, ...] = ()      # what its user was shown of its logs
    saved: tuple[str, ...] = ()      # checkpoints it reported saved
    changed_by: tuple[str, ...] = ()  # users whose action changed its record or files


@dataclass(frozen=True)
class Hold:
    source: str     # "run" (a run's record) or "slurm" (its accounting)
    owner: str      # the run's id, or the Slurm job's
    node: str
    gpu: int
    start: float
    end: float | None   # None: still held at the end


@dataclass(frozen=True)
class ProcessSeen:
    t: float
    node: str
    pid: int
    run_id: str
    user: str
    command: str = ""


@dataclass(frozen=True)
class Sample:
    t: float
    what: str       # "ui", "supervisor node0 RUN", "share records", ...
    rss: int = 0    # bytes
    fds: int = 0
    threads: int = 0


@dataclass(frozen=True)
class Cordon:
    node: str
    by: str
    reason: str


@dataclass(frozen=True)
class Attack:
    t: float
    attacker: str
    victim: str
    what: str                       # plan.ATTACKS
    got: tuple[str, ...] = ()       # what it must not have got: paths read, a stop let through
    said: str = ""                  # what the attacker was told, shortened


@dataclass(frozen=True)
class Violation:
    invariant: str
    what: str                       # one line a person reads first
    at: float                       # the moment it names, for `around`
    evidence: dict[str, Any] = field(default_factory=dict)


def around(history: list[Event], at: float, before: float = 120.0,
           after: float = 30.0) -> list[Event]:
    """The events from BEFORE seconds before AT to AFTER seconds after it, in order."""
    return sorted((e for e in history if at - before <= e.t <= at + after),
                  key=lambda e: e.t)
