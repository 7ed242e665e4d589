"""Early stopping of a sweep's trials by the median rule (pure): a running trial whose best
training loss so far is worse than the median of the other trials' losses at the step it
has reached is stopped, once it has trained `after` steps and at least `min_trials` others
reached that step. Losses and steps come from the trials' beats (`loss=`, `step=`), as
their timelines keep them (one point per window of the run: the median loss of its ranks,
and the highest step they said), so a script that prints neither is never stopped early.
A lower loss is better, whatever the metric the sweep ranks by (its FINAL_METRICS come at
the end, too late to stop anything).

    early_stop: {method: median, after: 200, min_trials: 3}
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..record.progress import Point

METHODS = ("median",)
MIN_TRIALS = 3   # other trials that reached the step, before any trial is judged at it

Curve = list[tuple[int, float]]   # (step, loss), steps rising


@dataclass(frozen=True)
class EarlyStop:
    after: int                  # a trial is judged once it has trained this many steps
    min_trials: int = MIN_TRIALS
    method: str = "median"


def curve(points: Iterable[Point]) -> Curve:
    """A trial's (step, loss) from its timeline: the windows that said both, steps rising
    (a window whose step is not past the last one's is left out: a restart's)."""
    found: Curve = []
    for p in points:
        if p.step is not None and p.loss is not None and (not found or p.step > found[-1][0]):
            found.append((p.step, p.loss))
    return found


def loss_at(points: Curve, step: int) -> float | None:
    """The loss of a trial at STEP: between two of its points, on the line between them;
    None when it has not reached STEP (nor passed it)."""
    if not points or points[-1][0] < step:
        return None
    before = [(s, v) for s, v in points if s <= step]
    if not before:
        return points[0][1]   # judged at a step before its first window: its first loss
    s0, v0 = before[-1]
    if s0 == step:
        return v0
    s1, v1 = next((s, v) for s, v in points if s > step)
    return v0 + (v1 - v0) * (step - s0) / (s1 - s0)


def judge(rule: EarlyStop, running: Mapping[int, Curve],
          others: Mapping[int, Curve]) -> dict[int, str]:
    """The running trials to stop, each with why: {trial number: why}. OTHERS: every
    trial's curve (running or ended; a trial is never compared with itself)."""
    stop: dict[int, str] = {}
    for number, mine in running.items():
        if not mine or mine[-1][0] < rule.after:
            continue
        step = mine[-1][0]
        theirs = [v for n, c in others.items() if n != number
                  if (v := loss_at(c, step)) is not None]
        if len(theirs) < rule.min_trials:
            continue
        best = min(v for _, v in mine)
        median = statistics.median(theirs)
        if best > median:
            stop[number] = (f"stopped early at step {step}: its best loss {best:.4g} is worse "
                            f"than the median {median:.4g} of {len(theirs)} other trials there")
    return stop
