"""`runs` (list the recorded runs), `runs show RUN` (one run's summary) and
`logs RUN [--node NAME] [--follow]`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..errors import ClusterError
from ..record.listing import listed, what
from ..record.rundir import RunDir, list_runs, open_run
from ..report.page import write_report
from ..run.conclude import show
from ..run.settle import settle
from . import values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list the runs recorded in the runs directory, show "
                       "one (`runs show RUN`), or draw its report (`runs report RUN`)")
    p.add_argument("show", nargs="?", metavar="show|report",
                   help="show RUN: status, each node's end, step times, stragglers, hang; "
                   "report RUN: write RUN/report.html again (every run gets one at its end)")
    p.add_argument("run", nargs="?", type=values.run_id, help="the run to show or report")
    values.add_runs_dir(p)
    p.set_defaults(func=_runs)

    p = sub.add_parser("logs", help="show a run's logs (all nodes, or one)")
    p.add_argument("run", type=values.run_id, help="run id (see `python -m orchestrator runs`)")
    p.add_argument("--node", type=values.node(), help="only this node's log")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep printing new lines until the run ends")
    values.add_runs_dir(p)
    p.set_defaults(func=_logs)


def _runs(args: argparse.Namespace) -> int:
    if args.show is not None and args.show not in ("show", "report"):
        raise ClusterError(f"runs {args.show}: to show one run, say `runs show {args.show}`; "
                           f"to draw its report, `runs report {args.show}`")
    if args.show:
        if not args.run:
            raise ClusterError(f"runs {args.show}: name the run, e.g. `runs {args.show} RUN` "
                               "(see `runs`)")
        run = open_run(Path(args.runs_dir), args.run)
        return _show(run) if args.show == "show" else _report(run)
    runs = list_runs(Path(args.runs_dir))
    if not runs:
        print(f"no runs in {args.runs_dir}/")
        return 0
    print(f"{'RUN':<24} {'STATUS':<20} {'NODES':<20} {'DURATION':>9}  SCRIPT")
    for run in runs:
        r = listed(run, settle)
        print(f"{r.run_id:<24} {r.status:<20} {r.nodes:<20} {r.duration:>9}  {r.what}")
        if r.note:
            print(f"note: {r.note}", file=sys.stderr)
    return 0


def _show(run: RunDir) -> int:
    info = run.info()
    summary = settle(run)
    if summary is None and info.get("queued"):
        print(f"run {run.run_id}: waiting in Slurm's queue since {info['queued'].get('since')}; "
              f"`queue` shows why, `stop {run.run_id}` cancels it")
        return 0
    if summary is None:
        print(f"run {run.run_id}: running on {', '.join(info['nodes'])}; follow it with "
              f"`attach {run.run_id}`, look inside with `diagnose {run.run_id}`")
        return 0
    print("\n".join(show(run.run_id, summary, what(run))))
    print(f"  logs: python -m orchestrator logs {run.run_id}; record: {run.path}/")
    return 0


def _report(run: RunDir) -> int:
    settle(run)   # a run whose controller is gone gets its summary first
    path = write_report(run)
    print(f"run {run.run_id}: {path} (one file: it opens in any browser, without a network)")
    return 0


def _log_paths(run: RunDir, node: str | None) -> list[Path]:
    nodes = run.info()["nodes"]
    if node is not None and node not in nodes:
        raise ClusterError(f"run {run.run_id} ran on {', '.join(nodes)}, not on {node!r}")
    return [run.log(n) for n in ([node] if node else nodes)]


def _logs(args: argparse.Namespace) -> int:
    run = open_run(Path(args.runs_dir), args.run)
    paths = _log_paths(run, args.node)
    offsets = {p: 0 for p in paths}
    while True:
        finished = run.ended  # looked at before the logs: nothing is missed
        for path in paths:
            if not path.exists():
                continue
            with open(path, encoding="utf-8", errors="replace") as fh:
                fh.seek(offsets[path])
                data = fh.read()
                # Keep a partial last line for the next round.
                cut = data.rfind("\n") + 1 if args.follow and not finished else len(data)
                sys.stdout.write(data[:cut])
                offsets[path] += len(data[:cut].encode("utf-8", errors="replace"))
        sys.stdout.flush()
        if not args.follow or finished:
            return 0
        time.sleep(0.5)
