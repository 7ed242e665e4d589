"""A run's status and its summary: the one rule and the one writer, whoever concludes the
run (`train` or `attach` following it to its end, `runs` settling it from what its nodes
left on the share), and the one way a summary is said (`runs`, `runs show`, the end of
`train` and `attach`).

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
import sys
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..errors import LaunchError
from ..node.protocol import STATE_STALE, STOP_REQUESTED, End, read_end
from .ends import NodeEnds, how_it_ended, scan_log
from .recovery import Recovery

if TYPE_CHECKING:
    from .command import NodeCommand
    from .record import RunDir

LAST_LINES = 30          # any line: torchrun's own error report is about 20 lines
LAST_WORKER_LINES = 10   # lines the training processes printed


@dataclass
class NodeOutcome:
    """How one node's part of a run ended, as the controller that followed it saw it."""
    node: str
    exit_code: int | None = None     # None: no exit status (connection lost)
    reason: End = End.RUNNING        # EXITED, LOST or STOPPED (`why` says for what)
    why: str = ""                    # e.g. the peer that failed
    ended: float | None = None
    last_lines: deque = field(default_factory=lambda: deque(maxlen=LAST_LINES))
    last_worker_lines: deque = field(default_factory=lambda: deque(maxlen=LAST_WORKER_LINES))

    @property
    def failed(self) -> bool:
        return self.reason == End.LOST or (self.exit_code not in (0, None))


@dataclass
class JobResult:
    """What following a run to its end found: the rule (decide) reads it."""
    outcomes: dict[str, NodeOutcome]
    first_failed: str | None
    interrupted: bool
    started: float
    ended: float
    why_interrupted: str = ""
    hang: dict[str, Any] | None = None   # the hang found (summary.json "hang")
    hung: bool = False                   # and the run was stopped for it
    progress: dict[str, Any] = field(default_factory=dict)  # step times, stragglers

    @property
    def ok(self) -> bool:
        return not self.interrupted and self.first_failed is None and all(
            o.exit_code == 0 for o in self.outcomes.values())


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
    return Verdict(completed, finished, after, {n: c for n, c in codes.items() if c})


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
          extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary (summary.json) of a run that has ended: the one writer."""
    from .record import iso

    def node_end(n: NodeEnd) -> dict[str, Any]:
        reason, why = n.reason, n.why
        if decision.first_failed and n.name == first_seen and n.name != decision.first_failed:
            # It failed first only because the cause's ranks went away under its collectives.
            reason, why = End.PEER_FAILED, decision.first_failed
        elif reason.caused_elsewhere and reason != End.STOPPED:
            reason, why = End.STOPPED, f"{reason} {why}".strip()  # the cause is kept
        return {"end_reason": reason.value, **({"why": why} if why else {})}

    verdict = decision.verdict
    commands = info.get("commands") or {}
    return {
        **info,
        "status": decision.status,
        "start": iso(start), "end": iso(end), "duration_s": round(end - start, 3),
        "nodes": [{"name": n.name, **({"node_rank": n.node_rank} if n.node_rank is not None
                                      else {}),
                   "nproc": n.nproc, "exit_code": n.exit_code, **node_end(n),
                   **({"log": str(run.log(n.name))} if run else {})} for n in nodes],
        "exit_codes": {n.name: n.exit_code for n in nodes},
        "first_failed": decision.first_failed,
        "training_completed": True if decision.ok else verdict.training_completed,
        **({"after_finish": verdict.after_finish} if verdict.after_finish else {}),
        "rank_exit_codes": {n: {str(r): c for r, c in sorted(codes.items())}
                            for n, codes in verdict.exit_codes.items()},
        **({"command": {n: shlex.join(argv) for n, argv in commands.items()}}
           if commands else {}),
        **(extra or {}),
    }


def cut_short(info: dict[str, Any], status: RunStatus, started: float, error: str,
              launched: Iterable[str] = ()) -> dict[str, Any]:
    """The summary of a run that `train` left before following it to its end: Ctrl-C or a
    failure during the code sync or the launch (nothing started, or what started was
    stopped), or a second Ctrl-C (the LAUNCHED nodes stop the job themselves once the
    controller's lease ends)."""
    import time

    from .record import iso
    ended, launched = time.time(), set(launched)
    left = {"end_reason": "controller-lost", "why": "train left at once (a second Ctrl-C); "
            "the node stops the job when the controller's lease ends"} \
        if status == RunStatus.INTERRUPTED else \
        {"end_reason": "stopped", "why": "the launch failed on another node"}
    return {**info, "status": status, "start": iso(started), "end": iso(ended),
            "duration_s": round(ended - started, 3),
            "nodes": [{"name": n, "exit_code": None,
                       **(left if n in launched else {"end_reason": "not-started"})}
                      for n in info.get("nodes", [])],
            "exit_codes": {}, "first_failed": None, "error": error}


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


def make_summary(info: dict, commands: list[NodeCommand], names: list[str],
                 result: JobResult, sync_seconds: float, run: RunDir) -> dict:
    """The summary of a run its controller followed to its end (train, attach)."""
    nodes = [NodeEnd(n, c.nproc, result.outcomes[n].exit_code, result.outcomes[n].reason,
                     result.outcomes[n].ended, result.outcomes[n].why, c.node_rank)
             for n, c in zip(names, commands, strict=True)]
    ends = read_ends(names, run)
    decision = decide(nodes, ends, clean_exit=all(c.clean_exit for c in commands),
                      stop_requested=(run.path / STOP_REQUESTED).exists(),
                      interrupted=result.interrupted, hung=result.hung,
                      first_seen=result.first_failed)
    progress = result.progress
    from .record import iso
    first_beat, last_step = progress.get("first_beat"), progress.get("last_step")
    info = {**info, "commands": {n: c.torchrun_argv()
                                 for n, c in zip(names, commands, strict=True)}}
    return write(info, nodes, decision, start=result.started, end=result.ended, run=run,
                 first_seen=result.first_failed, extra={
                     "sync_s": round(sync_seconds, 3),
                     **({"hang": result.hang} if result.hang else {}),
                     **({"step_times": progress["nodes"]} if progress.get("nodes") else {}),
                     **({"stragglers": progress["stragglers"]}
                        if progress.get("stragglers") else {}),
                     **({"first_step_at": iso(first_beat)} if first_beat else {}),
                     **({"last_step": last_step} if last_step is not None else {})})


def summarize(info: dict[str, Any], states: dict[str, dict], now: float,
              run: RunDir | None = None) -> dict | None:
    """The summary of a run from its nodes' states on the share (no controller followed
    it to its end), or None while it still runs. A node that never wrote its state, or
    that a peer named lost (silent on the network), or whose state file went stale (not
    rewritten for STATE_STALE by the clock of the node that read it: every node of the run
    is gone, none is left to name it) is lost: its end is its state's last writing."""
    names = info["nodes"]
    ended = {n: s for n, s in states.items() if s.get("state") == "ended"}
    blamed = {s.get("why") for s in ended.values() if read_end(s.get("reason")) == End.PEER_LOST}
    lost = [n for n in names if n not in ended and (
        n in blamed or n not in states
        or now - float(states[n].get("time", 0)) > STATE_STALE)]
    if len(ended) + len(lost) < len(names):
        return None
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
    from .record import iso
    return write(info, nodes, decision, start=start, end=end, run=run,
                 extra={"settled_from": "the nodes' state on the shared filesystem",
                        **({"first_step_at": iso(min(beats))} if beats else {})})


# -- how a summary is said ------------------------------------------------------------------
def conclude(run: RunDir, result: JobResult, summary: dict) -> int:
    """The end of `train` and `attach`: one line, the exit status, and for a run that did
    not succeed the error that names why (LaunchError)."""
    print(f"run {run.run_id}: {summary['status']} after {summary['duration_s']:.1f} s; "
          f"logs and summary in {run.path}/ (to look at: {run.report_html})", flush=True)
    after = summary.get("after_finish") or {}
    if summary["status"] == RunStatus.SUCCEEDED:
        if after:  # finished, then a worker died in torch's teardown: not the training
            print(f"run {run.run_id}: the training completed on every rank; "
                  f"{'; '.join(n for notes in after.values() for n in notes)}",
                  file=sys.stderr)
        return 0
    if summary["status"] == RunStatus.HUNG:
        hang = summary["hang"]
        raise LaunchError(f"run {run.run_id} hung: no rank made progress for "
                          f"{hang['quiet_s']:.0f} s; holding it up: {suspects(hang)}. The "
                          f"job was stopped on every node. Every rank's stack: "
                          f"{hang['dumps']}/")
    if summary["status"] in (RunStatus.INTERRUPTED, RunStatus.STOPPED):
        print(f"run {run.run_id}: {summary['status']}; the job was stopped on every node",
              file=sys.stderr)
        return 130 if summary["status"] == RunStatus.INTERRUPTED else 1
    if summary["status"] == RunStatus.CONTROLLER_LOST:
        raise LaunchError(f"run {run.run_id}: its controller went away and the nodes "
                          f"stopped the job; logs: {run.path}/")
    failed = summary.get("first_failed") or next(
        (n for n, o in result.outcomes.items() if o.failed), None)
    outcome = result.outcomes.get(failed) if failed else None
    how = ("lost its connection" if outcome and outcome.reason == End.LOST
           else "had its clustertrain supervisor fail"
           if outcome and outcome.reason == End.SUPERVISOR_FAILED
           else f"exited with code {outcome.exit_code}" if outcome else "failed")
    ranks = (summary.get("rank_exit_codes") or {}).get(failed) or {}
    if any(c != 0 for c in ranks.values()):  # the script's own code, e.g. sys.exit(3)
        how += " (" + ", ".join(f"rank {r} {how_it_ended(c)}" for r, c in ranks.items()
                                if c != 0) + ")"
    if result.first_failed and result.first_failed != failed:
        how += (f"; {result.first_failed} ended before it only because its ranks lost "
                f"their peers on {failed}")
    if failed in after:  # not the node's fault: its ranks had finished their scripts
        how = (f"exited with code {outcome.exit_code if outcome else '?'} after its ranks "
               f"finished ({'; '.join(after[failed])}), but not every rank of the run "
               "had finished its script")
    lines = list(outcome.last_worker_lines) if outcome else []
    lines += [line for line in (outcome.last_lines if outcome else [])
              if "/rank" not in line.split(" | ")[0]]
    tail = "\n    ".join(lines) if lines else "(no output)"
    hang = summary.get("hang")
    held = (f"\nA collective timed out; holding it up: {suspects(hang, 'nobody named')}. "
            f"Stacks of the ranks still running: {hang['dumps']}/"
            if hang and hang.get("trigger") else "")
    raise LaunchError(f"run {run.run_id} failed: {failed} {how} first; the other nodes were "
                      f"stopped. Last lines from {failed} (training processes first, then "
                      f"torchrun):\n    {tail}{held}\nFull logs: {run.path}/")


def suspects(hang: dict, nobody: str = "nobody") -> str:
    """The suspects of a hang's analysis, in words."""
    return "; ".join(f"rank {s['rank']} on {s['node']} {s['why']}" for s in hang["suspects"]) \
        or f"{nobody} ({hang['verdict']})"


def row(summary: dict | None) -> tuple[str, str]:
    """`runs`' STATUS and DURATION cells of a run (no summary: running)."""
    if summary is None:
        return str(RunStatus.RUNNING), "-"
    status = str(summary["status"])
    if summary.get("first_failed"):
        status += f" ({summary['first_failed']})"
    if summary.get("recovered_in"):
        status += f", recovered in {summary['recovered_in']}"
    elif summary.get("recoveries"):
        status += f" after {len(summary['recoveries'])} recover" + (
            "y" if len(summary["recoveries"]) == 1 else "ies")
    return status, f"{summary['duration_s']:.1f}s"


def show(run_id: str, summary: dict, what: str) -> list[str]:
    """`runs show RUN`: the run's status, each node's end, step times, stragglers and
    the hang."""
    from ..diagnosis.progress import Straggler
    first = f" (first failed: {summary['first_failed']})" if summary.get("first_failed") else ""
    lines = [f"run {run_id}: {summary['status']}{first} after {summary['duration_s']:.1f} s",
             f"  {what}"]
    times = summary.get("step_times") or {}
    lines.append(f"  {'NODE':<12} {'EXIT':>5}  {'END':<14} {'STEP_S':>8} {'SAMPLES/S':>10}")
    for node in summary.get("nodes", []):
        t = times.get(node["name"], {})
        step = f"{t['step_s']:.3f}" if "step_s" in t else "-"
        rate = f"{t['samples_per_s']:.1f}" if "samples_per_s" in t else "-"
        code = "-" if node.get("exit_code") is None else str(node["exit_code"])
        lines.append(f"  {node['name']:<12} {code:>5}  {node.get('end_reason', ''):<14} "
                     f"{step:>8} {rate:>10}")
    for s in summary.get("stragglers", []):
        lines.append("  straggler: " + Straggler(
            s["node"], s["rank"], s["step_s"], s["median_step_s"],
            tuple(s.get("windows") or (0, 0))).message())
    hang = summary.get("hang")
    if hang:
        lines.append(f"  hang found at {hang['detected_at']}: {hang['verdict']}")
        lines += [f"    suspect: rank {s['rank']} on {s['node']} {s['why']}"
                  for s in hang["suspects"]]
        lines.append(f"    every rank's stack: {hang['dumps']}/")
    if summary.get("error"):
        lines.append(f"  why: {summary['error']}")
    if summary.get("recovered_in"):
        lines.append(f"  a node failed: the run started again as {summary['recovered_in']} "
                     f"(`runs show {summary['recovered_in']}`)")
    for recovery in summary.get("recoveries") or []:
        lines.append("  " + Recovery(**recovery).line())
    return lines
