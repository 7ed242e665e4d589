"""A sweep's report (RUNS/SWEEP/report.html): the trials best first, each linked to its
run's own report; the metric against each parameter; and every trial's loss over its own
time, where its beats said one. Drawn from the sweep's record and its trials' records
alone, written on every trial's end and the sweep's; the same page, refreshed, is the
sweep's page in `clustertrain ui` (/sweeps/SWEEP/)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..record.rundir import RunDir, write_private
from ..report import svg
from ..report.page import TEMPLATES, read_timeline
from .record import SweepRecord, TrialRecord, TrialState
from .table import duration_text, metric_text

REPORT = "report.html"


def _dots(record: SweepRecord, index: int, best: TrialRecord | None) -> list[svg.Dot]:
    return [svg.Dot(t.values[index][1], t.metric, f"t{t.number}", t is best)
            for t in record.trials if t.metric is not None and len(t.values) > index]


def curves(record: SweepRecord, best: TrialRecord | None) -> str | None:
    """Every trial's loss (its beats', the median of its ranks' in each window) over the
    time since its own first window; None when no trial's beats said a loss."""
    series: list[svg.Series] = []
    span = 0.0
    for t in record.trials:
        if not t.run_id:
            continue
        points = [(p.t, p.loss) for p in read_timeline(RunDir(record.runs_dir, t.run_id))
                  if p.loss is not None]
        if not points:
            continue
        t0 = points[0][0]
        shifted = [(at - t0, loss) for at, loss in points]
        span = max(span, shifted[-1][0])
        name = f"t{t.number} " + " ".join(v for _, v in t.values)
        series.append(svg.Series(name, shifted, "best" if t is best else None))
    if not series:
        return None
    return svg.line_chart("Each trial's training loss, from its start", "loss", series,
                          0.0, span, css_class="chart curves")


def context(record: SweepRecord, served: bool) -> dict[str, Any]:
    ranked = record.ranked()
    best = ranked[0] if ranked and ranked[0].metric is not None else None
    flags = [flag for flag, _ in record.trials[0].values] if record.trials else []
    rows = []
    for t in ranked:
        href = None
        if t.run_id and RunDir(record.runs_dir, t.run_id).run_json.exists():
            href = f"/runs/{quote(t.run_id)}/" if served else f"../{quote(t.run_id)}/report.html"
        rows.append({"trial": f"t{t.number}", "cells": [v for _, v in t.values],
                     "nodes": ", ".join(t.nodes) or "-", "state": t.state.value,
                     "duration": duration_text(t.duration), "metric": metric_text(t.metric),
                     "run_id": t.run_id or "", "href": href, "best": t is best,
                     "why": t.why if t.state != TrialState.SUCCEEDED else ""})
    charts = [svg.scatter(f"{record.metric} against {flag}", flag, record.metric,
                          _dots(record, i, best)) for i, flag in enumerate(flags)]
    return {"sweep_id": record.sweep_id, "state": record.state, "why": record.why,
            "file": record.file, "metric": record.metric, "goal": record.goal,
            "parallel": record.parallel, "flags": flags, "rows": rows,
            "counts": record.tally(),
            "best": {"trial": f"t{best.number}", "args": " ".join(best.args),
                     "metric": metric_text(best.metric)} if best else None,
            "charts": charts if any(t.metric is not None for t in record.trials) else [],
            "curves": curves(record, best),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))}


def render_sweep(record: SweepRecord, refresh: int | None = None, served: bool = False) -> str:
    """The sweep's page. REFRESH: reload every so many seconds (a running sweep in `ui`);
    SERVED: its trials' links are the server's (a file on its own links their files)."""
    return TEMPLATES.get_template("sweep.html.j2").render(
        **context(record, served), refresh=refresh, served=served)


def write_sweep_report(record: SweepRecord) -> Path | None:
    """RECORD's report.html, written whole, its owner's only; a report that cannot be drawn
    costs the sweep nothing: a note on stderr, and None."""
    try:
        return write_private(record.path / REPORT, render_sweep(record))
    except Exception as exc:  # noqa: BLE001 - the sweep goes on, whatever its page does
        print(f"note: sweep {record.sweep_id}: its report.html could not be written ({exc})",
              file=sys.stderr)
        return None
