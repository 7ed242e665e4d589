"""Keeping a bad node out: a node a run lost, or a node doctor names, is cordoned in the
share's record that every user's preflight reads (node/cordon.py), and on a Slurm cluster
then drained with the same reason, so that the next allocations avoid it. It stays out
until `uncordon NODE` by the cordon's author or an admin (a member of the inventory's
cluster_admin_group), or a clean `doctor` on it run by one of them; on Slurm that also
returns it to Slurm. The slurm role installs `clustertrain-drain`, which drains and returns
a node by the record's rule, and lets the cluster's users run it with sudo, and nothing
else."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ClusterError
from ..node.answers import CordonAnswer
from ..node.cordon import CORDON, UNCORDON
from ..node.protocol import DRAIN
from ..node.requests import Cordon
from . import nodelib, ssh
from .inventory import Cluster, NodeSpec


@dataclass(frozen=True)
class KeptOut:
    """The nodes kept out, each with why: in the share's record, and in Slurm."""
    cordoned: dict[str, str] = field(default_factory=dict)
    drained: dict[str, str] = field(default_factory=dict)


def keep_out(cluster: Cluster, reasons: Mapping[str, str], run_id: str | None,
             asker: tuple[str, ssh.Connection] | None = None,
             say: Callable[[str], None] = print) -> KeptOut:
    """Cordon each node of REASONS ({node: why}) and, on a Slurm cluster, drain it, asked
    from ASKER (a node's name and connection; else a node of CLUSTER not to be kept out).
    RUN_ID: the run that found the nodes bad (None: a person's `cordon`)."""
    if not reasons:
        return KeptOut()
    pre = f"run {run_id}: " if run_id else ""
    own = None
    if asker is None:
        healthy = [n for n in cluster.nodes if n.name not in reasons]
        try:
            own = ssh.connect(healthy[0].name, healthy[0].ssh) if healthy else None
        except ClusterError:
            own = None
        asker = (healthy[0].name, own) if own is not None else None
    if asker is None:
        say(f"{pre}could not cordon {', '.join(reasons)}: no other node answers; "
            f"once one does: python -m orchestrator cordon NODE --why TEXT")
        return KeptOut()
    name, conn = asker
    try:
        spec = next(n for n in cluster.nodes if n.name == name) if name in cluster.names \
            else cluster.nodes[0]
        cordoned = {}
        for node, why in reasons.items():
            said = cordon_event(cluster, spec, conn, node, CORDON, why, run_id)
            if said.error:
                say(f"{pre}could not cordon {node}: {said.error}")
            else:
                cordoned[node] = why
        drained = _drain(cluster, reasons, pre, conn, say)
    finally:
        if own is not None:
            own.close()
    for node in cordoned:
        say(f"{pre}{node} is cordoned ({cordoned[node]}): every user's runs "
            f"keep it out until `python -m orchestrator uncordon {node}` once it is fixed "
            "(or a clean `doctor` on it)")
    return KeptOut(cordoned, drained)


def cordon_event(cluster: Cluster, spec: NodeSpec, conn: nodelib.Runs, node: str,
                 action: str, why: str, run_id: str | None) -> CordonAnswer:
    """Add NODE's ACTION (CORDON, UNCORDON) to the share's record through SPEC's node, as
    the node verb does (an uncordon: node/cordon.py's lift): its event, or why it was
    refused, or why not (ERROR: also when the node gave no answer)."""
    try:
        return nodelib.ask(conn, spec.python, Cordon(), node=spec.name, timeout=30,
                           stdin=json.dumps({"share": cluster.shared_path, "node": node,
                                             "action": action, "why": why, "run": run_id,
                                             "admin_group": cluster.admin_group}))
    except nodelib.NodeAnswerError as exc:
        return CordonAnswer(error=exc.said)


def _drain(cluster: Cluster, reasons: Mapping[str, str], pre: str, asker: ssh.Connection,
           say: Callable[[str], None]) -> dict[str, str]:
    """Drain each node of REASONS in Slurm (nothing without Slurm); those drained."""
    if cluster.scheduler != "slurm":
        return {}
    drained = {}
    for node, reason in reasons.items():
        result = asker.run(shlex.join(["sudo", "-n", DRAIN, node, reason]), timeout=30)
        if result.exit_code == 0:
            drained[node] = reason
            say(f"{pre}{node} is drained in Slurm ({reason}): the next "
                "allocations avoid it")
        else:
            say(f"{pre}could not drain {node} in Slurm "
                f"({result.stderr.strip()[-200:] or result.exit_code}); is this user in "
                "cluster_users (site.yml gives them clustertrain-drain)?")
    return drained


def uncordon(cluster: Cluster, node: str, why: str = "") -> str:
    """Return NODE to service: lift this user's cordons of it in the share's record (all of
    them for an admin), then on a Slurm cluster return it to Slurm (clustertrain-drain
    --resume, by the same rule); what Slurm says of it now ('' without Slurm).
    ClusterError, before anything is written, when its cordons are all another user's and
    this user is no admin; after lifting his own, when another user's still holds."""
    if node not in cluster.names:
        raise ClusterError(f"uncordon {node}: not a node of {cluster.inventory} "
                           f"({', '.join(cluster.names)})")
    first = next((n for n in cluster.nodes if n.name != node), cluster.nodes[0])
    conn = ssh.connect(first.name, first.ssh)
    try:
        said = cordon_event(cluster, first, conn, node, UNCORDON,
                            why or "returned to service", None)
        if said.refused or said.error:
            raise ClusterError(f"uncordon {node}: {said.refused or said.error}")
        held = said.held
        if held:
            authors = " and ".join(dict.fromkeys(c["by"] for c in held))
            raise ClusterError(
                f"uncordon {node}: your cordon is lifted, but {authors}'s still holds "
                f"({held[-1].get('why') or 'no reason given'}): only {authors} or an admin "
                f"(a member of group '{cluster.admin_group}') may lift it")
        return _resume(cluster, conn, node)
    finally:
        conn.close()


def _resume(cluster: Cluster, conn: ssh.Connection, node: str) -> str:
    """Return NODE, drained in Slurm, to Slurm; what Slurm says of it ('' without Slurm)."""
    if cluster.scheduler != "slurm":
        return ""
    state = _sinfo(conn, node)
    if not (state.split()[:1] and state.split()[0].rstrip("*~#$@").startswith(
            ("drain", "drng"))):
        return state
    result = conn.run(shlex.join(["sudo", "-n", DRAIN, "--resume", node]), timeout=30)
    if result.exit_code != 0:
        err = result.stderr.strip()[-300:] or f"exit {result.exit_code}"
        raise ClusterError(f"uncordon {node}: the share's record no longer cordons it, but "
                           f"it stays drained in Slurm: {err}")
    return _sinfo(conn, node)


def _sinfo(conn: ssh.Connection, node: str) -> str:
    return conn.run(shlex.join(["sinfo", "-h", "-n", node, "-o", "%t %E"]),
                    timeout=30).stdout.strip()


def cordons(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Every node of the share's record cordoned now: {node: its cordon}."""
    return cordon_record(cluster).cordoned


def cordon_record(cluster: Cluster) -> CordonAnswer:
    """The share's record as the node verb lists it: every node cordoned now, with its
    cordon, and the files that decide nothing (IGNORED)."""
    first = cluster.nodes[0]
    conn = ssh.connect(first.name, first.ssh)
    try:
        return nodelib.ask(conn, first.python, Cordon(), node=first.name, timeout=30,
                           stdin=json.dumps({"share": cluster.shared_path,
                                             "admin_group": cluster.admin_group}))
    except nodelib.NodeAnswerError as exc:
        raise ClusterError(f"{first.name}: cannot read the cordon record: "
                           f"{exc.said}") from None
    finally:
        conn.close()


def clear_cordons(cluster: Cluster, names: list[str], why: str,
                  say: Callable[[str], None] = print) -> list[str]:
    """Uncordon each of NAMES that is cordoned (a clean doctor found it well), by the rule
    of `uncordon`: those returned. One whose cordon this user may not lift (another
    user's, this user no admin) is said, and kept."""
    returned = []
    for node in [n for n in cordons(cluster) if n in names]:
        try:
            uncordon(cluster, node, why)
        except ClusterError as exc:
            say(f"{node} stays cordoned: {exc}")
            continue
        say(f"{node} is uncordoned ({why}): runs may use it again")
        returned.append(node)
    return returned
