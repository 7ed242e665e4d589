"""A sweep as a table, a row per trial: its number, parameters, nodes, state, duration and
the metric last. `sweep show` ranks the rows, best first; while the sweep runs (Live) the
table is redrawn in place on a terminal, and elsewhere each change is a line of its own.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from .record import SweepRecord, TrialRecord, TrialState

CLEAR_UP = "\x1b[{n}F\x1b[J"   # up N lines to their start, and erase from there down


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def metric_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def so_far(record: SweepRecord, trial: TrialRecord) -> str:
    """The metric's cell: its value once the trial ended; while it runs, its latest loss
    (its beats'), as `0.52 so far` when the metric is the loss, else `loss 0.52 so far`."""
    if trial.state != TrialState.RUNNING or trial.loss is None:
        return metric_text(trial.metric)
    said = metric_text(trial.loss) + " so far"
    return said if record.metric == "loss" else "loss " + said


def table(record: SweepRecord, ranked: bool = False) -> list[str]:
    """The trials as aligned rows under a header, ranked best first when RANKED."""
    flags = [flag for flag, _ in record.trials[0].values] if record.trials else []
    header = ["TRIAL", *flags, "NODES", "STATE", "DURATION", record.metric.upper()]
    rows = [[f"t{t.number}", *(v for _, v in t.values), ",".join(t.nodes) or "-",
             t.state.value, duration_text(t.duration or _running_for(t)), so_far(record, t)]
            for t in (record.ranked() if ranked else record.trials)]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in [header, *rows]]


def _running_for(trial: TrialRecord) -> float | None:
    return time.time() - trial.started if trial.state == TrialState.RUNNING and \
        trial.started else None


def change_line(record: SweepRecord, trial: TrialRecord) -> str:
    """One trial's change, as a line of its own."""
    params = " ".join(trial.args)
    if trial.state == TrialState.RUNNING:
        where = f" on {','.join(trial.nodes)}" if trial.nodes else ""
        return f"t{trial.number} {params}: started{where} as run {trial.run_id}"
    if trial.state == TrialState.EARLY:   # its why says so: "stopped early at step ..."
        return f"t{trial.number} {params}: {trial.why} ({duration_text(trial.duration)} in)"
    metric = f", {record.metric} {metric_text(trial.metric)}" if trial.metric is not None else ""
    why = f": {trial.why}" if trial.why and trial.state != TrialState.SUCCEEDED else ""
    return (f"t{trial.number} {params}: {trial.state.value} after "
            f"{duration_text(trial.duration)}{metric}{why}")


class Live:
    """The table while the sweep runs: SAY gets each line (default: stdout, where a
    terminal gets the table redrawn in place)."""

    def __init__(self, record: SweepRecord, say: Callable[[str], None] | None = None) -> None:
        self.record = record
        self.tty = say is None and sys.stdout.isatty()
        self.say = say or (lambda line: print(line, flush=True))
        self.drawn = 0   # lines of the table on the terminal now, to redraw over

    def begin(self) -> None:
        r = self.record
        todo = sum(t.state == TrialState.PENDING for t in r.trials)
        self.say(f"sweep {r.sweep_id}: {todo} trial(s), {r.parallel} at once, ranked by "
                 f"{r.metric} ({r.goal}); its record: {r.path}/")
        self.draw()

    def changed(self, trial: TrialRecord) -> None:
        if self.tty:
            self.draw()
        else:
            self.say(change_line(self.record, trial))

    def note(self, text: str) -> None:
        self.say(f"sweep {self.record.sweep_id}: {text}")
        self.drawn = 0   # the table is drawn anew below the note

    def draw(self) -> None:
        if not self.tty:
            return
        lines = table(self.record)
        if self.drawn:
            sys.stdout.write(CLEAR_UP.format(n=self.drawn))
        for line in lines:
            self.say(line)
        self.drawn = len(lines)
