"""`nodes [--since DATE] [--json]`: each node's state (its health check's verdict, its
cordon) and its failures over the last 30 days (the runs that lost it, the times its
health check failed), the repeat offenders first (cluster/node_health.py)."""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime

from ..cluster.inventory import load_cluster
from ..cluster.node_health import NodeHealth, NodesReport, gather
from . import values
from .cmd_usage import since_of


def register(sub: argparse._SubParsersAction) -> None:
    n = sub.add_parser("nodes", help="each node's health, cordon and failures, the worst first",
                       description="Each node's state: its health check's verdict (a timer "
                       "on every node, roles/health), its cordon, and its failures since "
                       "--since (default: the last 30 days): the runs that lost it and the "
                       "times its health check failed, the nodes with the most first; then "
                       "each failure.")
    n.add_argument("--since", metavar="DATE",
                   help="YYYY-MM-DD or YYYY-MM-DDTHH:MM (local time)")
    n.add_argument("--json", action="store_true", help="print it as JSON")
    values.add_inventory(n)
    n.set_defaults(func=_nodes)


def _nodes(args: argparse.Namespace) -> int:
    since = since_of(args.since, time.time(), "nodes")   # before any node is asked
    report = gather(load_cluster(args.inventory), since)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0
    for line in table(report):
        print(line)
    return 0


def _when(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def _said(node: NodeHealth) -> str:
    """What keeps NODE out, or what is wrong with it; "-" when nothing."""
    if node.error:
        return node.error
    failing = (node.verdict or {}).get("failing") or []
    if failing:
        return (f"since {_when((node.verdict or {}).get('since'))}: "
                + "; ".join(str(f.get("why")) for f in failing))
    if node.cordon:
        return (f"since {node.cordon.get('since')} by {', '.join(node.cordon.get('held_by') or [])}"
                f": {node.cordon.get('why') or 'no reason given'}")
    if not node.verdict:
        return "its health check never ran here (run site.yml: roles/health)"
    return "-"


def table(report: NodesReport) -> list[str]:
    lines = [f"since {_when(report.since)}",
             f"{'NODE':<14}{'STATE':<15}{'CHECKED':<18}{'RUNS LOST':>10}{'HEALTH':>8}  WHY"]
    for n in report.nodes:
        checked = _when((n.verdict or {}).get("checked")) if n.verdict else "-"
        lines.append(f"{n.name:<14}{n.state:<15}{checked:<18}{len(n.runs_failed):>10}"
                     f"{n.health_failures:>8}  {_said(n)}")
    if report.share_error:
        lines.append(f"(the share could not be read, so cordons and failures are not "
                     f"shown: {report.share_error})")
    events = sorted(((e["time"], n.name, f"health check {e.get('event')}"
                      + (": " + "; ".join(f.get("why", "") for f in e.get("failures") or [])
                         if e.get("failures") else ""))
                     for n in report.nodes for e in n.events if e.get("time")),
                    key=lambda x: x[0])
    events += [(r["time"], n.name, f"run {r['run']} ({r['by']}) lost it: {r['why']}")
               for n in report.nodes for r in n.runs_failed]
    if events:
        lines.append("")
        lines += [f"{_when(t)}  {name:<14}{what}" for t, name, what in sorted(events)]
    return lines
