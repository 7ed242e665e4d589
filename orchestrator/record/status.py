"""A run's status: the one rule (`decide`) and the summary it makes (`write`; `cut_short`
for a run left before its end), whoever concludes the run (`train` or `attach` following
it to its end, run/conclude.py; `runs` settling it from what its nodes left on the share,
`summarize`), read from the record alone (pure but for the nodes' logs that `read_ends`
reads). The summary's shape is record/summary.py's; RunDir.write_summary writes it.

The rule (`decide`), in order: every node exited 0, succeeded; a stop was asked for,
stopped; the controller was interrupted (Ctrl-C), interrupted; the nodes found it hung,
hung; every rank's script finished with code 0 (its marker, whatever killed a worker in
torch's teardown after that), succeeded; a node failed by itself (its torchrun's code, its
supervisor, its loss; the first by time, unless its ranks only lost a peer: root_cause),
failed naming it; a node named lost by its peers, failed naming it; the attached
controller went away, controller-lost; stopped on purpose, stopped.
"""

from __future__ import annotations

import shlex
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..node.protocol import STATE_STALE, STOP_REQUESTED, End, read_end
from .ends import NodeEnds, how_it_ended, scan_log
from .rundir import RunDir, iso
from .summary import NOT_STARTED, NodeSummary, RunStatus, Summary

LAST_LINES = 30          # any line of a node's log: torchrun's own error report is about 20


@dataclass(frozen=True)
class NodeEnd:
    """A node's part of the run as it ended: as the controller saw it end (attached), or
    as the node's supervisor wrote it on the share (settled)."""

    name: str
    nproc: int
    exit_code: int | None        # torchrun's; None: no exit status (lost)
    reason: End                  # as the node said it (LOST: no word from it)
    ended: float | None = None   # when it ended (a lost node: its last heartbeat)
    why: str = ""                # the peer that failed, ...
    node_rank: int | None = None


@dataclass(frozen=True)
class Verdict:
    training_completed: bool | None  # None: not known (no runner, so no markers)
    finished: dict[int, int]         # every rank's marker: rank -> the script's exit code
    after_finish: dict[str, list[str]]  # node -> how its ranks died after they finished
    # node -> rank -> the script's exit code (its marker), or for a rank that never
    # finished, the code torchrun reported for it (negative: the signal that ended it)
    exit_codes: dict[str, dict[int, int]] = field(default_factory=dict)
    no_space: dict[str, str] = field(default_factory=dict)  # node -> its full place

    def notes(self) -> list[str]:
        return [note for notes in self.after_finish.values() for note in notes]


def judge(nodes: list[NodeEnd], ends: dict[str, NodeEnds], clean_exit: bool) -> Verdict:
    """Did the training complete (every rank's script ended with code 0), and which
    failed nodes failed only after their ranks had finished?"""
    finished: dict[int, int] = {}
    for node in nodes:
        finished.update(ends.get(node.name, NodeEnds()).finished)
    world = sum(n.nproc for n in nodes)
    completed = (all(finished.get(r) == 0 for r in range(world)) if clean_exit and world
                 else None)
    after: dict[str, list[str]] = {}
    for node in nodes:
        if node.exit_code in (0, None) or node.reason == End.LOST:
            continue
        node_ends = ends.get(node.name, NodeEnds())
        done = {r: c for r, c in node_ends.finished.items() if c == 0}
        if node_ends.failed:
            if all(r in done for r in node_ends.failed):
                after[node.name] = [
                    f"rank {r} on {node.name} finished, then {how_it_ended(c)} in torch's "
                    "teardown" for r, c in sorted(node_ends.failed.items())]
        elif done and len(done) >= node.nproc:
            # No report names a rank: the node was stopped, or torchrun's output was lost.
            after[node.name] = [
                f"every rank on {node.name} had finished when the node was stopped"
                if node.reason != End.EXITED else f"every rank on {node.name} finished, "
                f"then torchrun {how_it_ended(node.exit_code)}"]
    codes = {node.name: {**ends[node.name].failed, **ends[node.name].finished}
             for node in nodes if node.name in ends}
    full = {n: e.no_space for n, e in ends.items() if e.no_space}
    return Verdict(completed, finished, after, {n: c for n, c in codes.items() if c}, full)


def root_cause(first: str | None, nodes: list[NodeEnd], ends: dict[str, NodeEnds]) -> str | None:
    """The node a failed run is named after. FIRST, the first node seen failing, unless
    its ranks failed only because a peer went away (gloo's "Connection reset by peer":
    the node whose worker died can take longer to report it than its peers take to fail)
    and another node failed by itself: it was lost, its supervisor failed, or one of its
    ranks ended with a code of its own (a script's error, a worker killed) without losing
    a peer. Then the first of those, by when each ended."""
    if first is None or not ends.get(first, NodeEnds()).peer_gone:
        return first
    stopped = (-signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGINT)
    for node in sorted(nodes, key=lambda n: n.ended if n.ended is not None else float("inf")):
        mine = ends.get(node.name, NodeEnds())
        if node.name == first or mine.peer_gone:
            continue
        codes = {**mine.failed, **mine.finished}.values()
        if node.reason in (End.LOST, End.SUPERVISOR_FAILED) or any(
                c not in (0, *stopped) for c in codes):
            return node.name
    return first


@dataclass(frozen=True)
class Decision:
    status: RunStatus
    first_failed: str | None   # the node a failed run is named after
    verdict: Verdict
    ok: bool                   # every node exited 0


def decide(nodes: list[NodeEnd], ends: dict[str, NodeEnds], *, clean_exit: bool = True,
           stop_requested: bool = False, interrupted: bool = False, hung: bool = False,
           first_seen: str | None = None) -> Decision:
    """The run's status (the module's docstring has the rule). FIRST_SEEN: the node the
    controller saw fail first (attached); else the first by when each ended."""
    verdict = judge(nodes, ends, clean_exit)
    reasons = {n.reason for n in nodes}
    ok = not interrupted and first_seen is None and bool(nodes) and all(
        n.exit_code == 0 for n in nodes)
    failed = first_seen
    if failed is None:
        by_time = sorted((n.ended or 0.0, n.name) for n in nodes
                         if n.reason in (End.LOST, End.SUPERVISOR_FAILED)
                         or (not n.reason.caused_elsewhere and n.exit_code not in (0, None)))
        failed = by_time[0][1] if by_time else None
    blamed = [n.why for n in nodes if n.reason == End.PEER_LOST and n.why]
    status: RunStatus
    first: str | None = None
    if ok:
        status = RunStatus.SUCCEEDED
    elif stop_requested:
        status = RunStatus.STOPPED
    elif interrupted:
        status = RunStatus.INTERRUPTED
    elif hung or End.HUNG in reasons:  # what failed then followed from the hang's stop
        status = RunStatus.HUNG
    elif verdict.training_completed:
        status = RunStatus.SUCCEEDED
    elif failed or blamed:
        status, first = RunStatus.FAILED, root_cause(failed, nodes, ends) if failed else blamed[0]
    elif End.CONTROLLER_LOST in reasons:
        status = RunStatus.CONTROLLER_LOST
    elif reasons & {End.STOPPED, End.PEER_STOPPED}:
        status = RunStatus.STOPPED
    else:
        status = RunStatus.SUCCEEDED
    return Decision(status, first, verdict, ok)


def write(info: dict[str, Any], nodes: list[NodeEnd], decision: Decision, *, start: float,
          end: float, run: RunDir | None = None, first_seen: str | None = None,
          **extra: Any) -> Summary:
    """The summary of a run that has ended (EXTRA: Summary's fields that following the
    run found: its hang, step times, ...)."""
    def node_end(n: NodeEnd) -> NodeSummary:
        reason, why = n.reason, n.why
        if decision.first_failed and n.name == first_seen and n.name != decision.first_failed:
            # It failed first only because the cause's ranks went away under its collectives.
            reason, why = End.PEER_FAILED, decision.first_failed
        elif reason.caused_elsewhere and reason != End.STOPPED:
            reason, why = End.STOPPED, f"{reason} {why}".strip()  # the cause is kept
        return NodeSummary(n.name, n.exit_code, reason.value, why, n.nproc, n.node_rank,
                           str(run.log(n.name)) if run else None)

    verdict = decision.verdict
    commands = info.get("commands") or {}
    return Summary(
        decision.status, round(end - start, 3), iso(start), iso(end),
        tuple(node_end(n) for n in nodes), {n.name: n.exit_code for n in nodes},
        decision.first_failed, True if decision.ok else verdict.training_completed,
        {n: {str(r): c for r, c in sorted(codes.items())}
         for n, codes in verdict.exit_codes.items()},
        after_finish=verdict.after_finish, no_space=verdict.no_space,
        command={n: shlex.join(argv) for n, argv in commands.items()},
        info=info, **extra)


def cut_short(info: dict[str, Any], status: RunStatus, started: float, error: str,
              launched: Iterable[str] = ()) -> Summary:
    """The summary of a run that `train` left before following it to its end: Ctrl-C or a
    failure during the code sync or the launch (nothing started, or what started was
    stopped), or a second Ctrl-C (the LAUNCHED nodes stop the job themselves once the
    controller's lease ends)."""
    ended, launched = time.time(), set(launched)
    left = NodeSummary("", None, "controller-lost", "train left at once (a second Ctrl-C); "
                       "the node stops the job when the controller's lease ends") \
        if status == RunStatus.INTERRUPTED else \
        NodeSummary("", None, "stopped", "the launch failed on another node")
    return Summary(status, round(ended - started, 3), iso(started), iso(ended),
                   tuple(replace(left, name=n) if n in launched else
                         NodeSummary(n, None, NOT_STARTED)
                         for n in info.get("nodes", [])),
                   error=error, info=info)


# -- how the run ended, from each source ----------------------------------------------------
def read_ends(names: list[str], run: RunDir) -> dict[str, NodeEnds]:
    """How each node's ranks ended, from the worker runner's markers and torchrun's
    failure reports in the nodes' logs (ends.py)."""
    ends: dict[str, NodeEnds] = {}
    for n in names:
        try:
            with open(run.log(n), encoding="utf-8", errors="replace") as log:
                ends[n] = scan_log(log)
        except OSError:
            ends[n] = NodeEnds()
    return ends


def ends_of(names: list[str], states: dict[str, dict], now: float
            ) -> tuple[dict[str, dict], list[str]] | None:
    """The nodes of NAMES that ended (their states) and those lost, or None while one still
    runs. A node that never wrote its state, or that a peer named lost (silent on the
    network), or whose state file went stale (not rewritten for STATE_STALE by the clock of
    the node that read it: every node of the run is gone, none is left to name it) is lost."""
    ended = {n: s for n, s in states.items() if s.get("state") == "ended"}
    blamed = {s.get("why") for s in ended.values() if read_end(s.get("reason")) == End.PEER_LOST}
    lost = [n for n in names if n not in ended and (
        n in blamed or n not in states
        or now - float(states[n].get("time", 0)) > STATE_STALE)]
    return None if len(ended) + len(lost) < len(names) else (ended, lost)


def summarize(info: dict[str, Any], states: dict[str, dict], now: float,
              run: RunDir | None = None) -> Summary | None:
    """The summary of a run from its nodes' states on the share (no controller followed
    it to its end), or None while it still runs (ends_of); a lost node's end is its
    state's last writing."""
    names = info["nodes"]
    over = ends_of(names, states, now)
    if over is None:
        return None
    ended = over[0]
    commands = info.get("node_commands") or {}

    def node(name: str) -> NodeEnd:
        c = commands.get(name) or {}
        nproc, rank = int(c.get("nproc") or 1), c.get("node_rank")
        if name in ended:
            s = ended[name]
            return NodeEnd(name, nproc, s.get("code"), read_end(s.get("reason")),
                           float(s.get("ended", 0)), s.get("why") or "", rank)
        return NodeEnd(name, nproc, None, End.LOST,
                       float(states.get(name, {}).get("time", 0)), "", rank)

    nodes = [node(n) for n in names]
    decision = decide(nodes, read_ends(names, run) if run else {},
                      clean_exit=all((commands.get(n) or {}).get("clean_exit", True)
                                     for n in names),
                      stop_requested=bool(run and (run.path / STOP_REQUESTED).exists()))
    start = min((float(s.get("started", now)) for s in states.values()), default=now)
    end = max((float(s.get("ended", now)) for s in ended.values()), default=now)
    # Recorded by nodes that may recover (node/supervise.py): when training ran again.
    beats = [float(s["first_beat"]) for s in states.values()
             if isinstance(s.get("first_beat"), (int, float))]
    return write(info, nodes, decision, start=start, end=end, run=run,
                 settled_from="the nodes' state on the shared filesystem",
                 first_step_at=iso(min(beats)) if beats else None)


# -- how a summary is said ---------------------------------------------------------------
def row(summary: Summary | None) -> tuple[str, str]:
    """`runs`' STATUS and DURATION cells of a run (no summary: running)."""
    if summary is None:
        return str(RunStatus.RUNNING), "-"
    status = str(summary.status)
    if summary.first_failed:
        status += f" ({summary.first_failed})"
    if summary.recovered_in:
        status += f", recovered in {summary.recovered_in}"
    elif summary.recoveries:
        status += f" after {len(summary.recoveries)} recover" + (
            "y" if len(summary.recoveries) == 1 else "ies")
    return status, f"{summary.duration_s:.1f}s"
