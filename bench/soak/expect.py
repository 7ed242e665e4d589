"""What the soak expects of a run from what it did to it: the end states its history allows
(`allowed` of history.RunSeen), whether it may recover, and whose actions changed it.

Only what the soak did counts, never how the run ended: a run nothing touched may only
succeed; a stop by its user allows `stopped`; a fault on one of its nodes while it lived
allows `failed` (and a recovery); the kill -9 of its `train` allows what an attached run
whose controller vanished may end as; the soak's own stop at its end allows `stopped`; a
start refused because the soak's other runs held its nodes allows `failed`.
An attack that got through counts its attacker among those who changed the run.

The history's events carry what this reads: a start's invoke names its run (`run`) and
nodes (`hosts`); a stop, an attach and an attack name their run; a fault names its node
(`node`), or the run whose `train` it killed (`run`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .history import Event

# Faults that may end a run that had a node where they struck.
NODE_FAULTS = ("kill-node", "stall-share", "fill-tmp", "gpu-xid", "cut-node-off")
# What an attached run whose controller was killed may end as (its nodes stop it after the
# lease; settled from the nodes' states).
CONTROLLER_GONE = ("controller-lost", "failed", "interrupted", "stopped")
STOP_AT_END = "stop-at-end"      # the soak's own stop of what still ran at its end
BREACHED = "breached"           # an attack's result, when it got what it must not
# A start refused before its launch because another run (the soak's own) held its nodes: a
# queued run's record then ends failed (a direct one's leaves no record).
REFUSED_IN_USE = " is in use by "


@dataclass(frozen=True)
class Expected:
    allowed: tuple[str, ...]
    may_recover: bool
    changed_by: tuple[str, ...]
    why: tuple[str, ...] = ()     # each thing that widened `allowed`, for the report


def expected(run_id: str, user: str, verb: str, nodes: Iterable[str], start: float,
             end: float | None, history: list[Event], *, chain: Iterable[str] = (),
             last_attempt: bool = True) -> Expected:
    """What RUN_ID (an attempt of the run the action VERB of USER started; CHAIN: every
    attempt's id, the first one's included) may end as, from HISTORY between START and END
    (None: the soak's end) on its NODES."""
    ids = {run_id, *chain}
    nodes = set(nodes)
    until = float("inf") if end is None else end
    allowed = ["succeeded"]
    why: list[str] = []
    changed: list[str] = []
    node_faults = 0

    def allow(states: Iterable[str], because: str) -> None:
        for state in states:
            if state not in allowed:
                allowed.append(state)
        why.append(because)

    for e in history:
        run = e.args.get("run")
        if e.kind == "invoke" and run in ids:
            if e.what == "stop" and e.actor == user:
                allow(("stopped",), f"{e.t:.0f} s: {user} stopped it")
                changed.append(user)
            elif e.what == STOP_AT_END:
                allow(("stopped", "interrupted"), f"{e.t:.0f} s: the soak stopped it at its end")
        elif e.kind in ("ok", "fail") and run in ids and e.result.startswith(BREACHED):
            changed.append(e.actor)
        elif (e.kind == "fail" and run in ids and e.actor == user and e.what == verb
              and REFUSED_IN_USE in e.result):
            allow(("failed",), f"{e.t:.0f} s: refused, its nodes in use by another run")
        elif e.kind == "fault" and start <= e.t <= until:
            if e.what == "kill-train-9" and run in ids:
                allow(CONTROLLER_GONE, f"{e.t:.0f} s: its train was killed (kill -9)")
            elif e.what in NODE_FAULTS and e.args.get("node") in nodes:
                node_faults += 1
                allow(("failed",), f"{e.t:.0f} s: {e.what} on {e.args['node']}")
    if not last_attempt:   # an attempt a recovery followed ended failed by design
        allow(("failed",), "a later attempt recovered it")
    stopped = any(w.endswith("stopped it") or "at its end" in w for w in why)
    may_recover = (verb == "train-recover" and last_attempt and node_faults <= 1
                   and not stopped)
    return Expected(tuple(allowed), may_recover, tuple(dict.fromkeys(changed)), tuple(why))
