"""`nodes`'s core: each node's health verdict (its health timer's, on its own disk), its
cordon, and its failures over a window (the runs that lost it and its health check's
events), read from the nodes and, on one node whose share answers, from the share."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..node.answers import HealthAnswer
from ..node.requests import Health
from . import nodelib, ssh
from .fanout import each
from .inventory import Cluster, NodeSpec

LOCAL_TIMEOUT = 30.0    # seconds: a node's own verdict (no share)
SHARE_TIMEOUT = 60.0    # seconds: the histories and the cordon record, on the share


@dataclass
class NodeHealth:
    """One node as `nodes` shows it."""

    name: str
    error: str | None = None                       # SSH or the node package failed
    verdict: dict[str, Any] | None = None          # node/health.py's state (None: never ran)
    cordon: dict[str, Any] | None = None           # its cordon in the share's record
    runs_failed: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)   # its history lines

    @property
    def state(self) -> str:
        if self.error:
            return "not answering"
        if self.verdict and self.verdict.get("failing"):
            return "failing"
        if self.cordon:
            return "cordoned"
        return "ok" if self.verdict else "unchecked"

    @property
    def health_failures(self) -> int:
        """Times its health check started failing, in the window."""
        return sum(e.get("event") == "failing" for e in self.events)

    @property
    def failures(self) -> int:
        """Runs it failed and times its health check started failing, in the window."""
        return len(self.runs_failed) + self.health_failures


@dataclass
class NodesReport:
    nodes: list[NodeHealth]
    since: float
    share_error: str | None = None   # the share could not be read from any node

    def to_json(self) -> dict[str, Any]:
        return {"since": self.since, "share_error": self.share_error,
                "nodes": [{**asdict(n), "state": n.state, "failures": n.failures}
                          for n in self.nodes]}


def _ask(node: NodeSpec, request: Health, timeout: float) -> HealthAnswer:
    """`node.py health` on NODE, its answer (NodeAnswerError: a RuntimeError)."""
    conn = ssh.connect(node.name, node.ssh)
    try:
        return nodelib.ask(conn, node.python, request, node=node.name, timeout=timeout)
    finally:
        conn.close()


def gather(cluster: Cluster, since: float) -> NodesReport:
    """Every node's verdict at once, then the share's part from the first node that
    answered and whose share answers; the repeat offenders first."""
    local = each(cluster.nodes, lambda n: _ask(n, Health(), timeout=LOCAL_TIMEOUT),
                 lambda n: n.name)
    nodes = {n.name: NodeHealth(n.name, error=str(r.error) if r.error else None,
                                verdict=r.value.state if r.value else None)
             for n, r in zip(cluster.nodes, local.values(), strict=True)}
    report = NodesReport(list(nodes.values()), since, "no node answered")
    for spec in cluster.nodes:
        node = nodes[spec.name]
        if node.error or any(f.get("check") == "share"
                             for f in (node.verdict or {}).get("failing") or []):
            continue
        try:
            shared = _ask(spec, Health(share=cluster.shared_path, since=since,
                                       admin_group=cluster.admin_group),
                          timeout=SHARE_TIMEOUT)
        except nodelib.NodeAnswerError as exc:   # it names the node
            report.share_error = str(exc)
            continue
        except Exception as exc:  # noqa: BLE001 - the next node may read it
            report.share_error = f"{spec.name}: {exc}"
            continue
        report.share_error = None
        for name, n in nodes.items():
            n.cordon = shared.cordoned.get(name)
            n.runs_failed = shared.runs_failed.get(name, [])
            n.events = shared.history.get(name, [])
        break
    report.nodes = ranked(report.nodes)
    return report


def ranked(nodes: list[NodeHealth]) -> list[NodeHealth]:
    """The repeat offenders first; then the nodes that are not well now; then by name."""
    return sorted(nodes, key=lambda n: (-n.failures, n.state == "ok", n.name))
