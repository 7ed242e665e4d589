"""Whether a run makes progress, and which node is slower than the others (pure).

Progress is any output of the run, a line or a part of one (a progress bar). A job that
prints nothing for long stretches (or that wants its step times compared) opts in with one
line per step, on every rank:

    print(f"##clustertrain beat step_s={seconds:.4f} samples={batch} loss={loss:.4f}",
          flush=True)

`step_s` is the time the rank spent on its own work in that step (data, forward, the
optimizer), without the time it waited for its peers in a collective: every rank of a
synchronous job waits for the slowest, so only its own work shows which one is slow.
Every field is optional (`step=N`, the training step reached, too); a bare
`##clustertrain beat` counts as progress only. A script that trains with
DistributedDataParallel needs none of this: the worker runner measures its steps
(node/steptime.py) and prints beats for it, marked `by=ddp`, with `wait_s=`, the time a
step waited for the peers (what shows the others waiting for a straggler). A rank that
prints beats of its own keeps them: its measured ones are then ignored. Beat lines are
not shown in the terminal nor kept in the run's log: what they say is kept per window of
WINDOW_S seconds (`Point`, the run's timeline.jsonl, its report's charts).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass

from ..node.protocol import BEAT_MARKER as BEAT

# Stragglers: a node is named when it was slower than the others in most windows of a
# minute or more, by more than the run's own spread. One noisy window (shared cores, a
# checkpoint, the first epoch's warm-up) names nobody.
WINDOW_S = 10.0         # step times are compared within windows of this many seconds
MIN_WINDOWS = 6         # a node is judged over this many windows at least (a minute)...
MOST = 2 / 3            # ...and named when it was slower in this share of them
STRAGGLER_RATIO = 1.2   # slower: its slowest rank's median step time over 1.2 x the others'
SPREAD_K = 2.0          # and above theirs by more than 2 x their own spread (scaled MAD)
MIN_STEPS = 3           # step times a rank must report in a window to count in it
HISTORY = 60            # windows kept (10 minutes)
RECENT = 20             # step times per rank behind the summary's step_s and samples/s


@dataclass(frozen=True)
class Beat:
    step_s: float | None = None
    samples: int | None = None
    step: int | None = None     # the training step it reached (optional: step=N)
    loss: float | None = None   # the job's training loss (optional: loss=X)
    wait_s: float | None = None  # of a step, the time it waited for its peers (wait_s=)
    measured: bool = False      # printed by the worker runner (by=...), not by the script


def parse_beat(text: str) -> Beat | None:
    """The beat a worker line carries, or None for any other line. Fields that do not
    parse are ignored (the beat still counts as progress)."""
    if not text.startswith(BEAT):
        return None
    rest = text[len(BEAT):]
    if rest and not rest[0].isspace():
        return None
    fields = dict(word.split("=", 1) for word in rest.split() if "=" in word)
    step_s = _seconds(fields, "step_s", positive=True)
    wait_s = _seconds(fields, "wait_s", positive=False)
    samples = None
    try:
        samples = int(fields["samples"])
    except (KeyError, ValueError):
        pass
    try:
        step: int | None = int(fields["step"])
    except (KeyError, ValueError):
        step = None
    loss: float | None = None
    try:
        value = float(fields["loss"])
        loss = value if math.isfinite(value) else None   # nan, inf: nothing to draw
    except (KeyError, ValueError):
        pass
    return Beat(step_s, samples, step, loss, wait_s, "by" in fields)


def _seconds(fields: dict[str, str], name: str, positive: bool) -> float | None:
    """FIELDS[NAME] as a finite number of seconds (over 0, or at least 0), else None."""
    try:
        value = float(fields[name])
    except (KeyError, ValueError):
        return None
    return value if (0 < value if positive else 0 <= value) and math.isfinite(value) else None


@dataclass(frozen=True)
class Straggler:
    node: str
    rank: int         # the node's slowest rank
    step_s: float     # its median step time, in the windows where the node was slower
    median_s: float   # the other nodes' median in those windows
    windows: tuple[int, int] = (0, 0)   # windows it was slower in, of those judged
    waited_s: float | None = None   # what the others waited for it a step (their wait_s)

    @property
    def slower_pct(self) -> int:
        return round((self.step_s / self.median_s - 1) * 100)

    def message(self) -> str:
        slow, judged = self.windows
        over = (f" in {slow} of {judged} windows of {WINDOW_S:g} s" if judged else "")
        waited = (f"; the other nodes waited {self.waited_s:.3f} s a step for it"
                  if self.waited_s is not None else "")
        return (f"{self.node} is {self.slower_pct} % slower than the median step time "
                f"(rank {self.rank}: {self.step_s:.3f} s per step, median "
                f"{self.median_s:.3f} s){over}{waited}")

    @classmethod
    def from_json(cls, raw: dict) -> Straggler:
        """A straggler as a summary keeps it (to_json)."""
        waited = raw.get("waited_s")
        return cls(raw["node"], raw["rank"], raw["step_s"], raw["median_step_s"],
                   tuple(raw.get("windows") or (0, 0)),
                   float(waited) if isinstance(waited, (int, float)) else None)

    def to_json(self) -> dict:
        return {"node": self.node, "rank": self.rank, "step_s": round(self.step_s, 6),
                "median_step_s": round(self.median_s, 6), "slower_pct": self.slower_pct,
                "windows": list(self.windows),
                **({"waited_s": round(self.waited_s, 6)} if self.waited_s is not None
                   else {})}


@dataclass(frozen=True)
class Judged:
    """One node in one window: its slowest rank, that rank's median step time, the other
    nodes' median, and whether it was slower by the rule; WAITED_S: what the others
    waited for it a step, when it was the node they waited for."""
    rank: int
    step_s: float
    reference_s: float
    slow: bool
    waited_s: float | None = None


def judge_window(ranks: dict[tuple[str, int], list[float]],
                 waits: dict[tuple[str, int], list[float]] | None = None
                 ) -> dict[str, Judged]:
    """Each node of one window, against the other nodes' ranks in it (with MIN_STEPS step
    times or more); nothing when fewer than two nodes reported. A node is slower when its
    step time is above the others' by the ratio and their spread, or when it is the node
    the others waited for (WAITS: each rank's wait_s, waited_for): a second noisy node
    widens the spread and drags the others' median, but not what the waits say."""
    steps = {key: times for key, times in ranks.items() if len(times) >= MIN_STEPS}
    nodes = sorted({node for node, _ in steps})
    if len(nodes) < 2:
        return {}
    medians = {key: statistics.median(times) for key, times in steps.items()}
    held = waited_for(nodes, medians, waits or {})
    judged = {}
    for node in nodes:
        rank, slowest = max(((r, m) for (n, r), m in medians.items() if n == node),
                            key=lambda item: item[1])
        others = [m for (n, _), m in medians.items() if n != node]
        reference = statistics.median(others)
        pooled = [t for (n, _), times in steps.items() if n != node for t in times]
        centre = statistics.median(pooled)
        spread = 1.4826 * statistics.median(abs(t - centre) for t in pooled)
        waited = held[1] if held and held[0] == node else None
        judged[node] = Judged(rank, slowest, reference,
                              waited is not None or (slowest > reference * STRAGGLER_RATIO
                                                     and slowest - reference > SPREAD_K * spread),
                              waited)
    return judged


def waited_for(nodes: list[str], medians: dict[tuple[str, int], float],
               waits: dict[tuple[str, int], list[float]]) -> tuple[str, float] | None:
    """The node the others waited for in a window, and how long a step: the node whose
    ranks waited least (its slowest rank waits for nobody), when the other nodes' median
    wait exceeds its own by more than STRAGGLER_RATIO's share of their step time. None
    unless every node's ranks said their waits (MIN_STEPS of them: DDP's measured beats)."""
    node_wait = {}
    for node in nodes:
        mine = [statistics.median(w) for (n, r), w in waits.items()
                if n == node and (n, r) in medians and len(w) >= MIN_STEPS]
        if not mine:
            return None
        node_wait[node] = min(mine)
    held = min(nodes, key=lambda n: node_wait[n])
    waited = statistics.median(w for n, w in node_wait.items() if n != held) - node_wait[held]
    reference = statistics.median(m for (n, _), m in medians.items() if n != held)
    return (held, waited) if waited > (STRAGGLER_RATIO - 1) * reference else None


def stragglers_of(windows: list[dict[str, Judged]]) -> list[Straggler]:
    """The nodes slower in most of MIN_WINDOWS judged windows or more."""
    found = []
    for node in sorted({n for w in windows for n in w}):
        mine = [w[node] for w in windows if node in w]
        slow = [j for j in mine if j.slow]
        if len(mine) < MIN_WINDOWS or len(slow) < MOST * len(mine):
            continue
        rank = statistics.mode(j.rank for j in slow)
        waited = [j.waited_s for j in slow if j.waited_s is not None]
        found.append(Straggler(node, rank, statistics.median(j.step_s for j in slow),
                               statistics.median(j.reference_s for j in slow),
                               (len(slow), len(mine)),
                               statistics.median(waited) if waited else None))
    return found


@dataclass(frozen=True)
class NodePoint:
    """One node in one window: its slowest rank's median step time, the samples per
    second of all its ranks (when the beats carry samples), and whether the straggler rule
    found it slower than the others in that window."""
    step_s: float
    samples_per_s: float | None = None
    slow: bool = False
    wait_s: float | None = None   # that rank's median time a step waited for its peers


@dataclass(frozen=True)
class Point:
    """One window of the run's timeline (runs/RUN/timeline.jsonl, the report's charts)."""
    t: float                      # the window's start, wall-clock seconds
    nodes: dict[str, NodePoint]
    loss: float | None = None     # the median of the losses the ranks' beats said in it
    step: int | None = None       # the highest step a rank's beats said in it (step=)

    def to_json(self) -> dict:
        return {"t": round(self.t, 3), "nodes": {
            n: {"step_s": round(p.step_s, 6),
                **({"samples_per_s": round(p.samples_per_s, 3)}
                   if p.samples_per_s is not None else {}),
                **({"wait_s": round(p.wait_s, 6)} if p.wait_s is not None else {}),
                **({"slow": True} if p.slow else {})} for n, p in sorted(self.nodes.items())},
            **({"loss": round(self.loss, 6)} if self.loss is not None else {}),
            **({"step": self.step} if self.step is not None else {})}

    @classmethod
    def from_json(cls, raw: dict) -> Point:
        """A point as to_json wrote it (KeyError, TypeError, ValueError: it was not)."""
        nodes = {str(n): NodePoint(float(p["step_s"]),
                                   float(p["samples_per_s"]) if "samples_per_s" in p else None,
                                   bool(p.get("slow", False)),
                                   float(p["wait_s"]) if "wait_s" in p else None)
                 for n, p in raw["nodes"].items()}
        loss, step = raw.get("loss"), raw.get("step")
        return cls(float(raw["t"]), nodes, float(loss) if loss is not None else None,
                   int(step) if step is not None else None)


def point_of(t: float, beats: dict[tuple[str, int], list[Beat]],
             judged: dict[str, Judged]) -> Point | None:
    """The timeline's point of one window (None: no beat in it said a step time or a loss)."""
    nodes: dict[str, NodePoint] = {}
    for node in sorted({n for n, _ in beats}):
        steps = {r: [b.step_s for b in bs if b.step_s is not None]
                 for (n, r), bs in beats.items() if n == node}
        medians = {r: statistics.median(times) for r, times in steps.items() if times}
        if not medians:
            continue
        samples = {r: [b.samples for b in beats[(node, r)] if b.samples is not None]
                   for r in medians}
        rates = [statistics.median(samples[r]) / medians[r] for r in medians if samples[r]]
        slowest = max(medians, key=lambda r: medians[r])
        waits = [b.wait_s for b in beats[(node, slowest)] if b.wait_s is not None]
        nodes[node] = NodePoint(medians[slowest], sum(rates) if rates else None,
                                node in judged and judged[node].slow,
                                statistics.median(waits) if waits else None)
    losses = [b.loss for bs in beats.values() for b in bs if b.loss is not None]
    if not nodes and not losses:
        return None
    reached = [b.step for bs in beats.values() for b in bs if b.step is not None]
    return Point(t, nodes, statistics.median(losses) if losses else None,
                 max(reached) if reached else None)


class Progress:
    """Fed every worker line of a run (from several threads); says how long the run has
    been quiet and which nodes straggle, and keeps the run's timeline, a point per window
    (`take_points`)."""

    def __init__(self, now: float, wall: float | None = None) -> None:
        self._lock = threading.Lock()
        self._start = self._last = now
        self._wall = time.time() if wall is None else wall   # NOW on the wall clock
        self._points: list[Point] = []   # the closed windows' points not yet taken
        self._steps: dict[tuple[str, int], deque[float]] = defaultdict(
            lambda: deque(maxlen=RECENT))
        self._samples: dict[tuple[str, int], deque[int]] = defaultdict(
            lambda: deque(maxlen=RECENT))
        self._waits: dict[tuple[str, int], deque[float]] = defaultdict(
            lambda: deque(maxlen=RECENT))
        self._own: set[tuple[str, int]] = set()   # ranks that print beats of their own
        # window index -> (node, rank) -> beats; closed windows' verdicts are kept
        self._windows: dict[int, dict[tuple[str, int], list[Beat]]] = defaultdict(
            lambda: defaultdict(list))
        self._judged: dict[int, dict[str, Judged]] = {}
        self._named: dict[str, Straggler] = {}
        self.first_beat: float | None = None   # wall-clock time of the run's first beat
        self.last_step: int | None = None      # the highest step a beat said

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
            key = (node, rank)
            if beat.measured and key in self._own:
                return True   # the script's own beats win
            if not beat.measured and key not in self._own:
                self._own.add(key)
                self._forget_measured(key)
            if self.first_beat is None:
                self.first_beat = time.time()
            if beat.step is not None:
                self.last_step = max(beat.step, self.last_step or 0)
            if beat.step_s is not None or beat.loss is not None:
                self._windows[self._window(now)][(node, rank)].append(beat)
            if beat.step_s is not None:
                self._steps[key].append(beat.step_s)
                if beat.samples is not None:
                    self._samples[key].append(beat.samples)
                if beat.wait_s is not None:
                    self._waits[key].append(beat.wait_s)
        return True

    def _forget_measured(self, key: tuple[str, int]) -> None:
        """Drop what the worker runner measured for KEY's rank until now, once the rank
        prints beats of its own (the two are not mixed in a window nor in the summary)."""
        for beats in self._windows.values():
            if key in beats:
                beats[key] = [b for b in beats[key] if not b.measured]
        for kept in (self._steps, self._samples, self._waits):
            kept.pop(key, None)

    def _window(self, now: float) -> int:
        return int(max(0.0, now - self._start) // WINDOW_S)

    def quiet_for(self, now: float) -> float:
        """Seconds since any rank last printed a line or a beat."""
        with self._lock:
            return max(0.0, now - self._last)

    def _medians(self) -> dict[tuple[str, int], float]:
        # Every rank that said a step time: a short run's few beats (one a second, each
        # the mean of the steps it covers) are its measure; MIN_STEPS is for judging a window.
        return {key: statistics.median(times) for key, times in self._steps.items() if times}

    def stragglers(self, now: float | None = None) -> list[Straggler]:
        """The nodes slower than the others in most windows of the last HISTORY (closed
        windows only: those before NOW's; all of them without NOW, at the end of a run),
        and those named so earlier in the run."""
        with self._lock:
            current = self._window(now) if now is not None else max(self._windows, default=0) + 1
            for index in sorted(self._windows):
                if index < current and index not in self._judged:
                    beats = self._windows[index]
                    self._judged[index] = judge_window(
                        {key: [b.step_s for b in bs if b.step_s is not None]
                         for key, bs in beats.items()},
                        {key: [b.wait_s for b in bs if b.wait_s is not None]
                         for key, bs in beats.items()})
                    point = point_of(self._wall + index * WINDOW_S, beats, self._judged[index])
                    if point is not None:
                        self._points.append(point)
            for index in [i for i in self._windows if i < current - HISTORY]:
                del self._windows[index]
                self._judged.pop(index, None)
            windows = [self._judged[i] for i in sorted(self._judged)]
            for s in stragglers_of(windows):
                self._named[s.node] = s
            return [self._named[n] for n in sorted(self._named)]

    def take_points(self) -> list[Point]:
        """The timeline's points of the windows closed (by `stragglers`) since the last
        call, in order."""
        with self._lock:
            points, self._points = self._points, []
            return points

    def to_json(self) -> dict:
        """Per node: the median step time of its slowest rank (and the time that rank
        waited for its peers a step, when measured) and the samples per second of all its
        ranks (when the beats carry samples), over each rank's last RECENT steps; and the
        stragglers named during the run."""
        with self._lock:
            medians = self._medians()
            rates = {key: statistics.median(self._samples[key]) / step_s
                     for key, step_s in medians.items() if self._samples.get(key)}
            waits = {key: statistics.median(self._waits[key])
                     for key in medians if self._waits.get(key)}
        nodes: dict[str, dict] = defaultdict(dict)
        for key, step_s in sorted(medians.items(), key=lambda item: item[1]):
            node = key[0]   # the slowest rank's, the last one written of its node
            nodes[node]["step_s"] = round(step_s, 6)
            nodes[node].pop("wait_s", None)
            if key in waits:
                nodes[node]["wait_s"] = round(waits[key], 6)
        for (node, _), rate in rates.items():
            nodes[node]["samples_per_s"] = round(nodes[node].get("samples_per_s", 0.0) + rate, 3)
        return {"nodes": dict(sorted(nodes.items())),
                "stragglers": [s.to_json() for s in self.stragglers()],
                "first_beat": self.first_beat, "last_step": self.last_step}
