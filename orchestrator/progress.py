"""Whether a run makes progress, and which node is slower than the others (pure).

Progress is any output of the run, a line or a part of one (a progress bar). A job that
prints nothing for long stretches (or that wants its step times compared) opts in with one
line per step, on every rank:

    print(f"##clustertrain beat step_s={seconds:.4f} samples={batch}", flush=True)

`step_s` is the time the rank spent on its own work in that step (data, forward, the
optimizer), without the time it waited for its peers in a collective: every rank of a
synchronous job waits for the slowest, so only its own work shows which one is slow.
Both fields are optional; a bare `##clustertrain beat` counts as progress only. Beat lines
are not shown in the terminal nor kept in the run's log.
"""

from __future__ import annotations

import statistics
import threading
from collections import defaultdict, deque
from dataclasses import dataclass

BEAT = "##clustertrain beat"
STRAGGLER_RATIO = 1.2   # a rank this much slower than the median rank is a straggler
MIN_STEPS = 5           # step times a rank must report before it is compared
WINDOW = 20             # the most recent step times kept per rank


@dataclass(frozen=True)
class Beat:
    step_s: float | None = None
    samples: int | None = None


def parse_beat(text: str) -> Beat | None:
    """The beat a worker line carries, or None for any other line. Fields that do not
    parse are ignored (the beat still counts as progress)."""
    if not text.startswith(BEAT):
        return None
    rest = text[len(BEAT):]
    if rest and not rest[0].isspace():
        return None
    fields = dict(word.split("=", 1) for word in rest.split() if "=" in word)
    step_s = samples = None
    try:
        step_s = float(fields["step_s"])
        if not 0 < step_s < float("inf"):
            step_s = None
    except (KeyError, ValueError):
        pass
    try:
        samples = int(fields["samples"])
    except (KeyError, ValueError):
        pass
    return Beat(step_s, samples)


@dataclass(frozen=True)
class Straggler:
    node: str
    rank: int         # the node's slowest rank
    step_s: float     # its median step time
    median_s: float   # the median over every rank of the run

    @property
    def slower_pct(self) -> int:
        return round((self.step_s / self.median_s - 1) * 100)

    def message(self) -> str:
        return (f"{self.node} is {self.slower_pct} % slower than the median step time "
                f"(rank {self.rank}: {self.step_s:.3f} s per step, median "
                f"{self.median_s:.3f} s)")

    def to_json(self) -> dict:
        return {"node": self.node, "rank": self.rank, "step_s": round(self.step_s, 6),
                "median_step_s": round(self.median_s, 6), "slower_pct": self.slower_pct}


class Progress:
    """Fed every worker line of a run (from several threads); says how long the run has
    been quiet and which nodes straggle."""

    def __init__(self, now: float) -> None:
        self._lock = threading.Lock()
        self._last = now
        self._steps: dict[tuple[str, int], deque[float]] = defaultdict(
            lambda: deque(maxlen=WINDOW))
        self._samples: dict[tuple[str, int], deque[int]] = defaultdict(
            lambda: deque(maxlen=WINDOW))

    def output(self, now: float) -> None:
        """Some output of the run arrived, whole lines or not (a progress bar that
        redraws itself with carriage returns prints no line for a whole epoch)."""
        with self._lock:
            self._last = max(self._last, now)

    def line(self, node: str, rank: int, text: str, now: float) -> bool:
        """Record a line of RANK on NODE; True when it is a beat (not to be shown)."""
        beat = parse_beat(text)
        with self._lock:
            self._last = max(self._last, now)
            if beat is None:
                return False
            if beat.step_s is not None:
                self._steps[(node, rank)].append(beat.step_s)
                if beat.samples is not None:
                    self._samples[(node, rank)].append(beat.samples)
        return True

    def quiet_for(self, now: float) -> float:
        """Seconds since any rank last printed a line or a beat."""
        with self._lock:
            return max(0.0, now - self._last)

    def _medians(self) -> dict[tuple[str, int], float]:
        return {key: statistics.median(times) for key, times in self._steps.items()
                if len(times) >= MIN_STEPS}

    def stragglers(self) -> list[Straggler]:
        """Nodes whose slowest rank takes STRAGGLER_RATIO times the median rank's step
        time or more; compared once ranks of two nodes or more have reported."""
        with self._lock:
            medians = self._medians()
        if len({node for node, _ in medians}) < 2:
            return []
        median = statistics.median(medians.values())
        slowest: dict[str, tuple[int, float]] = {}
        for (node, rank), step_s in medians.items():
            if step_s > slowest.get(node, (0, 0.0))[1]:
                slowest[node] = (rank, step_s)
        return [Straggler(node, rank, step_s, median)
                for node, (rank, step_s) in sorted(slowest.items())
                if step_s > median * STRAGGLER_RATIO]

    def to_json(self) -> dict:
        """Per node: the median step time of its slowest rank and the samples per second
        of all its ranks (when the beats carry samples); and the stragglers."""
        with self._lock:
            medians = self._medians()
            rates = {key: statistics.median(self._samples[key]) / step_s
                     for key, step_s in medians.items() if self._samples.get(key)}
        nodes: dict[str, dict] = defaultdict(dict)
        for (node, _), step_s in medians.items():
            nodes[node]["step_s"] = round(max(step_s, nodes[node].get("step_s", 0.0)), 6)
        for (node, _), rate in rates.items():
            nodes[node]["samples_per_s"] = round(nodes[node].get("samples_per_s", 0.0) + rate, 3)
        return {"nodes": dict(sorted(nodes.items())),
                "stragglers": [s.to_json() for s in self.stragglers()]}
