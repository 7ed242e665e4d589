"""How a run that its controller followed ends: its summary from what following it found
(`make_summary`, by the one rule of record/status.py), the summary and its report written
(`write_summary`: whoever concludes a run writes both), and the one way a summary is said
(`conclude` at the end of `train` and `attach`, `show` for `runs show`).
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import LaunchError
from ..node.protocol import STOP_REQUESTED, End
from ..record.ends import how_it_ended
from ..record.progress import Straggler
from ..record.rundir import RunDir, iso
from ..record.status import LAST_LINES, NodeEnd, decide, read_ends, write
from ..record.summary import RunStatus, Summary
from ..report.page import try_write_report

if TYPE_CHECKING:
    from .command import NodeCommand

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
    system_flags: list[dict] = field(default_factory=list)  # record/system.py's Flags

    @property
    def ok(self) -> bool:
        return not self.interrupted and self.first_failed is None and all(
            o.exit_code == 0 for o in self.outcomes.values())


def make_summary(info: dict, commands: list[NodeCommand], names: list[str],
                 result: JobResult, sync_seconds: float, run: RunDir) -> Summary:
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
    first_beat, last_step = progress.get("first_beat"), progress.get("last_step")
    info = {**info, "commands": {n: c.torchrun_argv()
                                 for n, c in zip(names, commands, strict=True)}}
    return write(info, nodes, decision, start=result.started, end=result.ended, run=run,
                 first_seen=result.first_failed, sync_s=round(sync_seconds, 3),
                 hang=result.hang or None, step_times=progress.get("nodes") or {},
                 stragglers=progress.get("stragglers") or [],
                 system_flags=result.system_flags,
                 first_step_at=iso(first_beat) if first_beat else None, last_step=last_step)


def write_summary(run: RunDir, summary: Summary) -> None:
    """RUN concluded: its summary, and its report drawn from the record with it (a report
    that cannot be drawn costs the run nothing: report/page.py says so on stderr)."""
    run.write_summary(summary)
    try_write_report(run)


# -- how a summary is said ------------------------------------------------------------------
def conclude(run: RunDir, result: JobResult, summary: Summary) -> int:
    """The end of `train` and `attach`: one line, the exit status, and for a run that did
    not succeed the error that names why (LaunchError)."""
    print(f"run {run.run_id}: {summary.status} after {summary.duration_s:.1f} s; "
          f"logs and summary in {run.path}/ (to look at: {run.report_html})", flush=True)
    after = summary.after_finish
    if summary.status == RunStatus.SUCCEEDED:
        if after:  # finished, then a worker died in torch's teardown: not the training
            print(f"run {run.run_id}: the training completed on every rank; "
                  f"{'; '.join(n for notes in after.values() for n in notes)}",
                  file=sys.stderr)
        return 0
    if summary.status == RunStatus.HUNG:
        hung = summary.hang or {}
        raise LaunchError(f"run {run.run_id} hung: no rank made progress for "
                          f"{hung['quiet_s']:.0f} s; holding it up: {suspects(hung)}. The "
                          f"job was stopped on every node. Every rank's stack: "
                          f"{hung['dumps']}/")
    if summary.status in (RunStatus.INTERRUPTED, RunStatus.STOPPED):
        print(f"run {run.run_id}: {summary.status}; the job was stopped on every node",
              file=sys.stderr)
        return 130 if summary.status == RunStatus.INTERRUPTED else 1
    if summary.status == RunStatus.CONTROLLER_LOST:
        raise LaunchError(f"run {run.run_id}: its controller went away and the nodes "
                          f"stopped the job; logs: {run.path}/")
    failed = summary.first_failed or next(
        (n for n, o in result.outcomes.items() if o.failed), None)
    outcome = result.outcomes.get(failed) if failed else None
    how = ("lost its connection" if outcome and outcome.reason == End.LOST
           else "had its clustertrain supervisor fail"
           if outcome and outcome.reason == End.SUPERVISOR_FAILED
           else f"exited with code {outcome.exit_code}" if outcome else "failed")
    ranks = summary.rank_exit_codes.get(failed or "") or {}
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
    lines = [line for line in (outcome.last_lines if outcome else [])
             if "/rank" not in line.split(" | ")[0]]
    lines += list(outcome.last_worker_lines) if outcome else []   # the rank's error: last
    tail = "\n    ".join(lines) if lines else "(no output)"
    hang = summary.hang
    held = (f"\nA collective timed out; holding it up: {suspects(hang, 'nobody named')}. "
            f"Stacks of the ranks still running: {hang['dumps']}/"
            if hang and hang.get("trigger") else "")
    full = summary.no_space.get(failed or "")
    space = (f" It ran out of space (its ranks said a disk was full): on {failed}, {full}; "
             "free some there, or write elsewhere." if full else "")
    raise LaunchError(f"run {run.run_id} failed: {failed} {how} first; the other nodes were "
                      f"stopped.{space}{held}\nFull logs: {run.path}/. Last lines from {failed} "
                      f"(torchrun first, then the training processes):\n    {tail}")


def suspects(hang: dict, nobody: str = "nobody") -> str:
    """The suspects of a hang's analysis, in words."""
    return "; ".join(f"rank {s['rank']} on {s['node']} {s['why']}" for s in hang["suspects"]) \
        or f"{nobody} ({hang['verdict']})"


def show(run_id: str, summary: Summary, what: str) -> list[str]:
    """`runs show RUN`: the run's status, each node's end, step times, stragglers, the
    system metrics' flags and the hang."""
    first = f" (first failed: {summary.first_failed})" if summary.first_failed else ""
    lines = [f"run {run_id}: {summary.status}{first} after {summary.duration_s:.1f} s",
             f"  {what}"]
    lines.append(f"  {'NODE':<12} {'EXIT':>5}  {'END':<14} {'STEP_S':>8} {'WAIT_S':>8} "
                 f"{'SAMPLES/S':>10}")
    for node in summary.nodes:
        t = summary.step_times.get(node.name) or {}
        step = f"{t['step_s']:.3f}" if "step_s" in t else "-"
        wait = f"{t['wait_s']:.3f}" if "wait_s" in t else "-"
        rate = f"{t['samples_per_s']:.1f}" if "samples_per_s" in t else "-"
        code = "-" if node.exit_code is None else str(node.exit_code)
        lines.append(f"  {node.name:<12} {code:>5}  {node.end_reason:<14} "
                     f"{step:>8} {wait:>8} {rate:>10}")
    for s in summary.stragglers:
        lines.append("  straggler: " + Straggler.from_json(s).message())
    lines += [f"  system: {f['message']}" for f in summary.system_flags
              if isinstance(f, dict) and f.get("message")]
    hang = summary.hang
    if hang:
        lines.append(f"  hang found at {hang['detected_at']}: {hang['verdict']}")
        lines += [f"    suspect: rank {s['rank']} on {s['node']} {s['why']}"
                  for s in hang["suspects"]]
        lines.append(f"    every rank's stack: {hang['dumps']}/")
    if summary.error:
        lines.append(f"  why: {summary.error}")
    if summary.recovered_in:
        lines.append(f"  a node failed: the run started again as {summary.recovered_in} "
                     f"(`runs show {summary.recovered_in}`)")
    lines += ["  " + recovery.line() for recovery in summary.recoveries]
    return lines
