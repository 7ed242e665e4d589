"""`usage [--since DATE] [--runs] [--all]`: node- and GPU-hours per user (and per run),
the GPU-hours that sat idle (IDLE), and the runs that held GPUs idle for an hour or more,
from the runs' records on the share and, for runs folded away after FOLD_AFTER, their
users' ledgers by the day (node/usage.py says how a run is counted, node/fold.py when one
is folded)."""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime

from ..cluster.inventory import load_cluster
from ..cluster.share_usage import run_usage
from ..errors import InputError
from ..node.answers import UsageAnswer
from ..node.fold import FOLD_AFTER
from ..node.sysmetrics import GPU_IDLE_PCT
from . import values

DEFAULT_DAYS = 30


def register(sub: argparse._SubParsersAction) -> None:
    u = sub.add_parser("usage", help="node- and GPU-hours per user and per run",
                       description="Node-hours and GPU-hours per user (with --runs, per "
                       "run too) since --since (default: the last 30 days), the GPU-hours "
                       "whose GPUs did nothing (IDLE), and the runs and notebooks that held "
                       "GPUs idle for an hour or more, from the runs' records on the share: "
                       "every run of every way of starting one (attached, detached, queued, "
                       f"notebooks). A run that ended over {FOLD_AFTER / 86400:.0f} days ago "
                       "is folded into its user's ledger on the share by a later run's start "
                       "and counted from there by the UTC day (a day counts whole when most "
                       "of it lies in the window), with no line of its own. Yours; an admin "
                       "sees "
                       "everyone's with --all (as root, through sudo). On a Slurm cluster, "
                       "Slurm's own accounting (sacct) of the same window follows: every "
                       "allocation, whatever started it.")
    u.add_argument("--since", metavar="DATE", type=values.since,
                   help="YYYY-MM-DD or YYYY-MM-DDTHH:MM (local time)")
    u.add_argument("--runs", action="store_true", help="a line per run as well")
    u.add_argument("--all", action="store_true", dest="everyone",
                   help="every user's records, read as root (sudo on the first node)")
    u.add_argument("--json", action="store_true", help="print the figures as JSON")
    values.add_inventory(u)
    u.set_defaults(func=_usage)


def since_of(text: str | None, now: float, verb: str = "usage") -> float:
    """--since of VERB as seconds since the epoch (InputError naming the forms it takes,
    or today for a date after NOW)."""
    if text is None:
        return now - DEFAULT_DAYS * 86400
    try:
        return values.past(text, now)
    except ValueError as exc:
        raise InputError(f"{verb} --since {exc}") from None


def _usage(args: argparse.Namespace) -> int:
    since = since_of(args.since, time.time())
    found = run_usage(load_cluster(args.inventory), since, args.everyone)
    if args.json:
        print(json.dumps(found.to_json(), indent=2))
        return 0
    for line in table(found, args.runs):
        print(line)
    return 0


def _when(t: float | None) -> str:
    return "running" if t is None else datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def table(found: UsageAnswer, runs: bool = False) -> list[str]:
    """A row per user (the most GPU-hours, then node-hours, first), with --runs a row per
    run; then the runs whose GPUs sat idle for an hour or more, and the records that could
    not be read."""
    lines = [f"since {_when(found.since)}",
             f"{'USER':<12}{'RUNS':>6}{'NODE-HOURS':>12}{'GPU-HOURS':>11}{'IDLE':>8}"]
    users = sorted(found.users.items(),
                   key=lambda u: (-u[1].gpu_hours, -u[1].node_hours, u[0]))
    for user, t in users:
        lines.append(f"{user:<12}{t.runs:>6}{t.node_hours:>12.2f}{t.gpu_hours:>11.2f}"
                     f"{t.idle_gpu_hours:>8.2f}")
    if not users:
        lines.append("(no run in that time)")
    if runs and found.runs:
        lines.append(f"{'RUN':<28}{'USER':<10}{'NODES':>6}{'NODE-HOURS':>12}{'GPU-HOURS':>11}"
                     f"{'IDLE':>8}  START             END")
        for r in sorted(found.runs, key=lambda r: r.start):
            lines.append(f"{r.run:<28}{r.user:<10}{len(r.nodes):>6}"
                         f"{r.node_hours:>12.2f}{r.gpu_hours:>11.2f}"
                         f"{r.idle_gpu_hours:>8.2f}  "
                         f"{_when(r.start):<17} {_when(r.end)}")
    for user, f in found.ledger.items():
        lines.append(f"folded: {user}'s runs of {f.first_day} to {f.last_day} (UTC days; "
                     f"{f.runs} started then) are counted by the day from the usage ledger: "
                     f"their records were folded {FOLD_AFTER / 86400:.0f} days after they "
                     "ended")
    for r in sorted(found.idle, key=lambda r: -r.idle_gpu_hours):
        lines.append(f"idle: {r.run} ({r.user}, {', '.join(r.nodes)}) held "
                     f"{r.idle_gpu_hours:.2f} of its {r.gpu_hours:.2f} GPU-hours with "
                     f"its GPUs doing nothing (at or under {GPU_IDLE_PCT:g} % used)"
                     + ("; still running" if r.end is None else ""))
    slurm = found.slurm
    if slurm is not None:
        lines.append("Slurm's accounting (sacct), the same window: every allocation, whatever "
                     "started it")
        if slurm.error:
            lines.append(f"  not read: {slurm.error}")
        else:
            lines.append(f"  {'USER':<12}{'JOBS':>6}{'NODE-HOURS':>12}{'GPU-HOURS':>11}")
            for user, s in sorted(slurm.users.items(), key=lambda u: -u[1].gpu_hours):
                lines.append(f"  {user:<12}{s.jobs:>6}{s.node_hours:>12.2f}"
                             f"{s.gpu_hours:>11.2f}")
            if not slurm.users:
                lines.append("  (no job in that time)")
    for u in found.unread:
        lines.append(f"not read: {u.path} (owned by {u.owner}): {u.why}; an admin "
                     "sees it with usage --all")
    for u in found.refused:   # a record in a user's place by someone else
        lines.append(f"not counted: {u.path} (owned by {u.owner}): {u.why}")
    return lines
