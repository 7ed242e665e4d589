"""The soak's invariants: what must hold of a cluster however long it ran, whatever the
nemesis did and whoever pushed. Each one is a function of what the soak saw (history.py)
that returns its violations, each with the evidence a person needs; `check` runs them all.

- no_stack_in_a_success: a run that succeeded shows its user no traceback or stack frame
  (a plain 2-node run once printed 43 lines of torchrun's C++ stack, "TCPStore ... Failed
  to recv", from the node whose store went away first).
- no_gpu_held_twice: no GPU held by two runs at once, by the runs' records and Slurm's
  accounting together (each alone saw only its own).
- no_process_after_its_end: no process of a run alive after its record says it ended.
- ends_as_it_happened: every record ends, in a state its history allows.
- recoverable_runs_finish: a run allowed to recover does not end failed.
- saved_checkpoints_load: every checkpoint a run reported saved is there and reads.
- cordons_have_reasons: every cordon left at the end says why.
- nobody_changed_anothers_run: no user's action changed another user's run (admins may).
- attacks_got_nothing: every attack of the pushing user on another user's run or files
  was refused (a read of their checkpoints counts as much as a stop).
- bounded: memory, open files and threads of each long-lived process, and the share's
  records, do not keep growing.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from .history import Attack, Cordon, Hold, ProcessSeen, RunSeen, Sample, Violation

# A Python traceback, a frame of one, or a C++ stack as torch prints it.
STACK = re.compile(r"Traceback \(most recent call last\)|^\s*File \".*\", line \d+"
                   r"|frame #\d+:|Exception raised from ")
ENDED_SLACK = 10.0    # s: a process seen this long after its run's end is left behind
GROWTH = 1.25         # the last third's peak against the first third's
GROWTH_FLOOR = {"rss": 32 << 20, "fds": 16, "threads": 8}   # what growth is noise


@dataclass(frozen=True)
class Seen:
    """Everything the invariants read, gathered at the end of a soak."""
    runs: list[RunSeen] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)
    processes: list[ProcessSeen] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    cordons: list[Cordon] = field(default_factory=list)
    checkpoints: dict[str, bool] = field(default_factory=dict)   # path -> loads
    jobs: dict[str, str] = field(default_factory=dict)   # Slurm job -> the run it was for
    admins: frozenset[str] = frozenset()
    attacks: list[Attack] = field(default_factory=list)


def no_stack_in_a_success(seen: Seen) -> list[Violation]:
    found = []
    for run in seen.runs:
        if run.status != "succeeded":
            continue
        lines = [line for line in run.shown if STACK.search(line)]
        if lines:
            found.append(Violation(
                "no_stack_in_a_success", f"{run.run_id} of {run.user} succeeded and showed "
                f"{len(lines)} line(s) of a stack", run.end or run.start,
                {"run": run.run_id, "lines": lines[:5]}))
    return found


def _holder(hold: Hold, runs_of_jobs: dict[str, str]) -> str:
    """Who holds: a run, whichever record says so (a queued run's Slurm job is the run)."""
    if hold.source == "slurm":
        return runs_of_jobs.get(hold.owner, f"slurm job {hold.owner}")
    return hold.owner


def no_gpu_held_twice(seen: Seen) -> list[Violation]:
    by_gpu: dict[tuple[str, int], list[Hold]] = defaultdict(list)
    for hold in seen.holds:
        by_gpu[(hold.node, hold.gpu)].append(hold)
    found = []
    for (node, gpu), holds in sorted(by_gpu.items()):
        holds.sort(key=lambda h: h.start)
        for i, first in enumerate(holds):
            for second in holds[i + 1:]:
                first_end = float("inf") if first.end is None else first.end
                if second.start >= first_end:
                    continue
                a, b = _holder(first, seen.jobs), _holder(second, seen.jobs)
                if a != b:
                    found.append(Violation(
                        "no_gpu_held_twice", f"{node} GPU {gpu} held by {a} and {b} at once",
                        second.start, {"node": node, "gpu": gpu, "holds": [first, second]}))
    return found


def no_process_after_its_end(seen: Seen, slack: float = ENDED_SLACK) -> list[Violation]:
    ends = {r.run_id: r.end for r in seen.runs}
    found = []
    for p in seen.processes:
        end = ends.get(p.run_id)
        if end is not None and p.t > end + slack:
            found.append(Violation(
                "no_process_after_its_end", f"{p.node}: pid {p.pid} of {p.run_id} ({p.user}) "
                f"alive {p.t - end:.0f} s after its record ended", p.t,
                {"process": p, "ended": end}))
    return found


def ends_as_it_happened(seen: Seen) -> list[Violation]:
    found = []
    for run in seen.runs:
        if run.end is None or run.status == "running":
            found.append(Violation(
                "ends_as_it_happened", f"{run.run_id} of {run.user} still says "
                f"{run.status!r} after the soak", run.start, {"run": run.run_id}))
        elif run.allowed and run.status not in run.allowed:
            found.append(Violation(
                "ends_as_it_happened", f"{run.run_id} of {run.user} ended {run.status!r}; "
                f"what happened to it allows {', '.join(run.allowed)}", run.end,
                {"run": run.run_id, "status": run.status, "allowed": run.allowed}))
    return found


def recoverable_runs_finish(seen: Seen) -> list[Violation]:
    return [Violation("recoverable_runs_finish", f"{r.run_id} of {r.user} could recover and "
                      f"ended {r.status!r}", r.end or r.start, {"run": r.run_id})
            for r in seen.runs if r.may_recover and r.status == "failed"]


def saved_checkpoints_load(seen: Seen) -> list[Violation]:
    return [Violation("saved_checkpoints_load", f"{r.run_id} of {r.user} reported {path} "
                      f"saved; it is {'unreadable' if path in seen.checkpoints else 'missing'}",
                      r.end or r.start, {"run": r.run_id, "checkpoint": path})
            for r in seen.runs for path in r.saved if not seen.checkpoints.get(path)]


def cordons_have_reasons(seen: Seen) -> list[Violation]:
    return [Violation("cordons_have_reasons", f"{c.node} is cordoned by {c.by} with no "
                      "reason", 0.0, {"cordon": c})
            for c in seen.cordons if not c.reason.strip()]


def nobody_changed_anothers_run(seen: Seen) -> list[Violation]:
    return [Violation("nobody_changed_anothers_run", f"{who} changed {r.run_id} of {r.user}",
                      r.end or r.start, {"run": r.run_id, "by": who})
            for r in seen.runs for who in r.changed_by
            if who != r.user and who not in seen.admins]


def attacks_got_nothing(seen: Seen) -> list[Violation]:
    return [Violation("attacks_got_nothing", f"{a.attacker}'s {a.what} against {a.victim} got "
                      f"{'; '.join(a.got)}", a.t, {"attack": a})
            for a in seen.attacks if a.got]


def bounded(seen: Seen, growth: float = GROWTH) -> list[Violation]:
    """Each sampled thing's peak in the last third of its samples against the first
    third's: more than GROWTH times, and by more than GROWTH_FLOOR, is growth without
    bound as far as the soak can tell."""
    by_what: dict[str, list[Sample]] = defaultdict(list)
    for s in seen.samples:
        by_what[s.what].append(s)
    found = []
    for what, samples in sorted(by_what.items()):
        samples.sort(key=lambda s: s.t)
        third = len(samples) // 3
        if third < 2:
            continue   # too few to tell a trend from a moment
        for measure, floor in GROWTH_FLOOR.items():
            early = max(getattr(s, measure) for s in samples[:third])
            late = max(getattr(s, measure) for s in samples[-third:])
            if late > early * growth and late - early > floor:
                shown = (lambda n: f"{n >> 20} MiB") if measure == "rss" else str
                found.append(Violation(
                    "bounded", f"{what}: {measure} grew from {shown(early)} to {shown(late)}",
                    samples[-1].t, {"what": what, "measure": measure, "early": early,
                                    "late": late, "samples": len(samples)}))
    return found


INVARIANTS: dict[str, Callable[[Seen], list[Violation]]] = {
    f.__name__: f for f in (no_stack_in_a_success, no_gpu_held_twice, no_process_after_its_end,
                            ends_as_it_happened, recoverable_runs_finish,
                            saved_checkpoints_load, cordons_have_reasons,
                            nobody_changed_anothers_run, attacks_got_nothing, bounded)}


def check(seen: Seen) -> dict[str, list[Violation]]:
    """Every invariant's violations, by its name (an empty list: it held)."""
    return {name: invariant(seen) for name, invariant in INVARIANTS.items()}
