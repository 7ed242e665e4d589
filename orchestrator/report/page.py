"""A run's report (runs/RUN/report.html): one self-contained page, drawn from the run's
record alone (run.json, summary.json, timeline.jsonl, doctor.json, the nodes' logs), with
the charts inline (svg.py) and nothing fetched: it opens from a chat attachment. The same
page, refreshed, is a live run's page in `clustertrain ui` (ui/server.py).

The HTML is a Jinja template (templates/), which escapes every value from the record."""

from __future__ import annotations

import json
import sys
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2

from .. import defaults
from ..node.protocol import SYSTEM_INTERVAL
from ..record import system
from ..record.logstream import is_record
from ..record.progress import WINDOW_S, Point
from ..record.rundir import RecordUnreadable, RunDir, write_private
from ..record.status import LAST_LINES, row
from ..record.summary import RunStatus, Summary
from . import svg

FINAL_METRICS = "FINAL_METRICS "   # the job's last word (train/train.py): one JSON object
GAP_S = 2.5 * WINDOW_S   # windows further apart had no beats between them: the line is cut

TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("orchestrator.report", "templates"),
                          autoescape=True, undefined=jinja2.StrictUndefined,
                          trim_blocks=True, lstrip_blocks=True)


def _time(iso: str | None) -> float | None:
    try:
        return datetime.fromisoformat(iso).timestamp() if iso else None
    except ValueError:
        return None


def read_timeline(run: RunDir) -> list[Point]:
    """The run's progress windows in order (its system samples, and a line cut short by a
    crash, left out)."""
    return run.read_timeline(Point.from_json)


def attempts(run: RunDir, summary: Summary | None) -> list[RunDir]:
    """The attempts a recovered run went through, the first first, RUN last."""
    earlier = [RunDir(run.root, r.failed_run) for r in (summary.recoveries if summary else ())
               if r.failed_run]
    return [a for a in earlier if a.run_json.exists()] + [run]


@dataclass(frozen=True)
class Tail:
    node: str
    lines: list[str]
    path: str


def log_tail(path: Path, count: int = LAST_LINES) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return list(deque((line.rstrip("\n") for line in fh if not is_record(line)),
                              maxlen=count))
    except OSError:
        return []


def final_metrics(run: RunDir, nodes: Iterable[str]) -> dict[str, Any] | None:
    """The job's FINAL_METRICS line, if a node's log has one (the last wins)."""
    for node in nodes:
        for line in reversed(log_tail(run.log(node), 200)):
            _, _, text = line.partition(" | ")
            if text.startswith(FINAL_METRICS):
                try:
                    found = json.loads(text[len(FINAL_METRICS):])
                except ValueError:
                    continue
                if isinstance(found, dict):
                    return {k: v for k, v in found.items()
                            if isinstance(v, (int, float, str, bool)) or v is None}
    return None


def _why(summary: Summary) -> str:
    """Why the run ended as it did, in one line."""
    if summary.error:
        return summary.error
    hang = summary.hang
    if summary.status == RunStatus.HUNG and hang:
        return f"no rank made progress for {hang.get('quiet_s', '?')} s: {hang.get('verdict', '')}"
    failed = summary.first_failed
    if failed:
        node = summary.node(failed)
        ranks = summary.rank_exit_codes.get(failed) or {}
        codes = ", ".join(f"rank {r} exited with code {c}" for r, c in ranks.items() if c)
        how = (node.why or node.end_reason if node else "") or "failed"
        full = summary.no_space.get(failed)
        return f"{failed} failed first ({how}" + (f"; {codes}" if codes else "") + (
            f"; out of space: {full}" if full else "") + ")"
    return ""


def _in_order(seen: set[str], order: list[str]) -> list[str]:
    """The nodes SEEN in ORDER (the run's), then any other, by name."""
    return [n for n in order if n in seen] + sorted(seen - set(order))


def _series(points: list[Point], field: str, stragglers: dict[str, str],
            order: list[str]) -> list[svg.Series]:
    """A series per node, in ORDER (the run's), then any other node the beats named."""
    nodes = _in_order({n for p in points for n in p.nodes}, order)
    return [svg.Series(node, [(p.t, v) for p in points if node in p.nodes
                              and (v := getattr(p.nodes[node], field)) is not None],
                       stragglers.get(node)) for node in nodes]


def _marks(summary: Summary | None) -> list[svg.Mark]:
    if summary is None:
        return []
    marks = []
    for r in summary.recoveries:
        if (t := _time(r.failed_at)) is not None:
            marks.append(svg.Mark(t, f"{r.node} failed"))
        if (t := _time(r.training_again_at)) is not None:
            marks.append(svg.Mark(t, "training again", ok=True))
    if (hang := summary.hang) and (t := _time(hang.get("detected_at"))) is not None:
        marks.append(svg.Mark(t, "hang found"))
    return marks


def charts(points: list[Point], summary: Summary | None, start: float | None,
           end: float | None, order: list[str]) -> list[str]:
    """The step-time, wait, samples/s and loss charts of the run (none without beats)."""
    if not points:
        return []
    t0 = min(start or points[0].t, points[0].t)
    t1 = max(end or points[-1].t, points[-1].t + 1)
    stragglers = {s["node"]: f"straggler: {s.get('slower_pct', '?')} % slower"
                  for s in (summary.stragglers if summary else []) if isinstance(s, dict)}
    marks = _marks(summary)
    steps = _series(points, "step_s", stragglers, order)
    drawn = [svg.line_chart("Step time per node (its slowest rank's own work)", "s / step",
                            steps, t0, t1, marks, "chart step", GAP_S)]
    waits = [s for s in _series(points, "wait_s", stragglers, order) if s.points]
    if waits:
        drawn.append(svg.line_chart("Time waiting for peers per node (the same rank's)",
                                    "s / step", waits, t0, t1, marks, "chart wait", GAP_S))
    rates = [s for s in _series(points, "samples_per_s", stragglers, order) if s.points]
    if rates:
        drawn.append(svg.line_chart("Samples per second per node", "samples / s", rates, t0,
                                    t1, marks, "chart rate", GAP_S))
    loss = [(p.t, p.loss) for p in points if p.loss is not None]
    if loss:
        drawn.append(svg.line_chart("Training loss (median of the ranks' beats)", "loss",
                                    [svg.Series("loss", loss)], t0, t1, marks, "chart loss",
                                    GAP_S))
    return drawn


def _per_node(samples: list[system.Sample], order: list[str], value: Any,
              marked: dict[str, str]) -> list[svg.Series]:
    """A series per node (in ORDER, then any other) of VALUE(sample), None left out."""
    nodes = _in_order({s.node for s in samples}, order)
    series = [svg.Series(node, [(s.t, v) for s in samples if s.node == node
                                and (v := value(s)) is not None], marked.get(node))
              for node in nodes]
    return [s for s in series if s.points]


def _per_gpu(samples: list[system.Sample], order: list[str], value: Any,
             marked: dict[tuple[str, int], str]) -> list[svg.Series]:
    """A series per GPU ("node0 GPU 1") of VALUE(gpu sample)."""
    nodes = _in_order({s.node for s in samples}, order)
    return [svg.Series(f"{node} GPU {index}",
                       [(s.t, value(g)) for s in samples if s.node == node
                        for g in s.gpus if g.index == index], marked.get((node, index)))
            for node in nodes
            for index in sorted({g.index for s in samples if s.node == node for g in s.gpus})]


def system_charts(samples: list[system.Sample], flags: list[dict], start: float | None,
                  end: float | None, order: list[str]) -> list[str]:
    """The nodes' system metrics, a chart per metric with a line per node (per GPU):
    CPU, memory, the job's memory, the cluster interface's traffic in and out, and with
    nvidia-smi each GPU's utilisation and memory. A flagged node's (GPU's) line is marked."""
    if not samples:
        return []
    t0 = min(start or samples[0].t, samples[0].t)
    t1 = max(end or samples[-1].t, samples[-1].t + 1)
    memory = {f["node"]: "low memory" for f in flags if f.get("kind") == "memory"}
    idle = {(f["node"], f["gpu"]): "idle" for f in flags
            if f.get("kind") == "gpu-idle" and "gpu" in f}
    mb, gib = 1e6, float(system.GIB)
    wanted = [
        ("CPU use per node (all its cores)", "%",
         _per_node(samples, order, lambda s: s.cpu_pct, {}), "cpu"),
        ("Memory in use per node", "%", _per_node(samples, order, lambda s: s.mem_pct,
                                                   memory), "memory"),
        ("The job's processes' memory per node (resident)", "GiB",
         _per_node(samples, order, lambda s: None if s.job_rss is None else s.job_rss / gib,
                   memory), "rss"),
        ("Network in per node (its cluster interface)", "MB / s",
         _per_node(samples, order, lambda s: None if s.rx_bps is None else s.rx_bps / mb,
                   {}), "net-in"),
        ("Network out per node (its cluster interface)", "MB / s",
         _per_node(samples, order, lambda s: None if s.tx_bps is None else s.tx_bps / mb,
                   {}), "net-out"),
        ("GPU utilisation", "%", _per_gpu(samples, order, lambda g: g.util_pct, idle),
         "gpu-util"),
        ("GPU memory in use", "GiB", _per_gpu(samples, order, lambda g: g.mem_used / gib, {}),
         "gpu-memory"),
    ]
    return [svg.line_chart(title, unit, series, t0, t1, (), f"chart system {kind}",
                           system.GAP_S)
            for title, unit, series, kind in wanted if series]


def doctor_section(doctor: dict) -> dict[str, Any]:
    """The doctor's findings: the link matrix as a heatmap, each node's numbers."""
    names = [n["name"] for n in doctor.get("nodes", [])]
    cells = {(lk["src"], lk["dst"]): (None if lk.get("error") else float(lk["gbit_s"]))
             for lk in doctor.get("links", [])}
    suspects = {s["node"]: s["why"] for s in doctor.get("suspects", [])}
    rows = [{"name": n["name"], "send": n.get("send_gbit_s"), "recv": n.get("recv_gbit_s"),
             "rtt": n.get("latency_ms"), "gflops": min(n["gflops"]) if n.get("gflops") else None,
             "device": n.get("device", "?"), "suspect": suspects.get(n["name"])}
            for n in doctor.get("nodes", [])]
    return {"heatmap": svg.heatmap("Links, Gbit/s (row sends to column)", names, cells,
                                   "Gbit/s", marked=sorted(suspects)),
            "nodes": rows, "suspects": suspects, "allreduce": doctor.get("allreduce") or {},
            "rule": (doctor.get("thresholds") or {}).get("rule", "")}


def _hang(hang: dict) -> dict[str, Any]:
    suspects = {(s["node"], s["rank"]) for s in hang.get("suspects", [])}
    groups = []
    for g in hang.get("groups", []):
        ranks = [(r["node"], r["rank"]) for r in g.get("ranks", [])]
        where = (f"in {g['collective']}" if g.get("collective") else "outside any collective")
        if g.get("seq") is not None:
            where = f"#{g['seq']} {g.get('collective') or '?'} in process group " \
                    f"{g.get('process_group')}" + (f" ({g['state']})" if g.get("state") else "")
        groups.append({"where": where, "frame": g.get("frame"), "ranks": ranks,
                       "suspect": any(r in suspects for r in ranks)})
    groups.sort(key=lambda g: (not g["suspect"], -len(g["ranks"])))
    return {**hang, "groups": groups}


def context(run: RunDir) -> dict[str, Any]:
    """Everything the page shows, from the record as it stands (a live run: no summary)."""
    info = run.info()
    try:
        summary = run.summary()
    except RecordUnreadable as exc:
        summary, unreadable = None, str(exc)
    else:
        unreadable = ""
    status, duration = row(summary)
    names = [n.name for n in summary.nodes] if summary and summary.nodes else \
        list(info.get("nodes") or [])
    points = [p for a in attempts(run, summary) for p in read_timeline(a)]
    samples = [s for a in attempts(run, summary) for s in a.read_timeline(system.Sample.from_json)]
    # A live run's flags from its samples, by the rule its controller says them by.
    flags = summary.system_flags if summary else \
        [f.to_json() for f in system.flags_of(
            samples, float(info.get("gpu_idle", defaults.GPU_IDLE)))]
    start = _time(summary.start if summary else None)
    if start is None and points:
        start = points[0].t
    end = _time(summary.end if summary else None)
    fp = info.get("fingerprint") or {}
    times = summary.step_times if summary else {}
    ended = {n.name: n.to_json() for n in summary.nodes} if summary else {}
    nodes = [{**ended.get(name, {}), "name": name, **(times.get(name) or {}),
              "log": run.log(name).name} for name in names]
    doctor_path = run.path / "doctor.json"
    try:
        doctor = json.loads(doctor_path.read_text()) if doctor_path.exists() else None
    except (OSError, ValueError):
        doctor = None
    script = f"{info.get('script', '?')} {' '.join(info.get('script_args', []))}".strip()
    return {
        "run_id": run.run_id, "status": status if summary or not unreadable else "unreadable",
        "duration": duration, "summary": summary.to_json() if summary else {},
        "why": _why(summary) if summary else
        unreadable, "running": summary is None and not unreadable,
        "facts": [("user", ", ".join(sorted(set((info.get("users") or {}).values()))) or "?"),
                  ("script", script),
                  ("nodes", ", ".join(names)),
                  ("started", (summary.start if summary else None) or "-"),
                  ("ended", (summary.end if summary else None) or "-"),
                  ("code revision", info.get("code_revision") or "not a git work tree"),
                  ("environment", _environment(fp)),
                  ("python environment", info.get("python_env") or "the cluster's"),
                  ("master", "{addr}:{port}".format(**info["master"])
                   if isinstance(info.get("master"), dict) else "-"),
                  ("slurm job", str((info.get("slurm") or {}).get("job_id", "-"))
                   if info.get("slurm") else "-")],
        "nodes": nodes,
        "charts": charts(points, summary, start, end, names),
        "has_steps": any(p.nodes for p in points),
        "stragglers": summary.stragglers if summary else [],
        "system": system_charts(samples, flags, start, end, names),
        "system_flags": [f for f in flags if isinstance(f, dict) and f.get("message")],
        "hang": _hang(summary.hang) if summary and summary.hang else None,
        "recoveries": [r.to_json() for r in summary.recoveries] if summary else [],
        "recovered_in": summary.recovered_in if summary else None,
        "metrics": final_metrics(run, names),
        "doctor": doctor_section(doctor) if doctor else None,
        "tails": [Tail(n, log_tail(run.log(n)), run.log(n).name) for n in names],
    }


def _environment(fp: dict) -> str:
    if not fp:
        return "-"
    torch = (fp.get("packages") or {}).get("torch")
    return ", ".join(x for x in (f"sha256 {str(fp.get('sha256', '?'))[:12]}",
                                 f"python {fp['python']}" if fp.get("python") else "",
                                 f"torch {torch}" if torch else "") if x)


def render_run(run: RunDir, refresh: int | None = None, served: bool = False) -> str:
    """The run's page. REFRESH: reload every so many seconds (a live run in `ui`); SERVED:
    its logs are links the server answers (a file on its own has them beside it)."""
    return TEMPLATES.get_template("run.html.j2").render(
        **context(run), refresh=refresh, served=served, window_s=WINDOW_S,
        system_interval=SYSTEM_INTERVAL)


def write_report(run: RunDir) -> Path:
    """Write RUN's report.html (atomically: a reader never sees half of it; its owner's
    only, as the rest of the record)."""
    return write_private(run.report_html, render_run(run))


def try_write_report(run: RunDir) -> Path | None:
    """RUN's report.html from its record as it stands, for whoever wrote to the record
    last (a run's conclusion, doctor's analysis). A report that cannot be drawn costs the
    run nothing: a note on stderr, and None."""
    try:
        return write_report(run)
    except Exception as exc:  # noqa: BLE001 - the record is kept, whatever the report does
        print(f"note: run {run.run_id}: its report.html could not be written ({exc}); "
              f"`runs report {run.run_id}` tries again", file=sys.stderr)
        return None
