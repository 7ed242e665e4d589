"""On a Slurm cluster, a node a run lost, or a node doctor names, is drained with the
reason, so that the next allocations avoid it until an admin returns it (`undrain`). The
slurm role installs `clustertrain-drain` and lets the cluster's users run it with sudo,
and nothing else."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from typing import Any

from ..cluster import ssh
from ..cluster.inventory import Cluster
from ..errors import ClusterError

DRAIN = "/usr/local/sbin/clustertrain-drain"   # roles/slurm's slurm_drain_command


def lost_nodes(summary: Mapping[str, Any]) -> dict[str, str]:
    """The nodes the run lost (no word from them: down, cut off), each with why."""
    return {n["name"]: n.get("why") or "no word from it"
            for n in summary.get("nodes") or [] if n.get("end_reason") == "lost"}


def drain_lost(summary: Mapping[str, Any], cluster: Cluster,
               clients: Mapping[str, ssh.Connection],
               say: Callable[[str], None] = print) -> dict[str, str]:
    """Drain each node the run lost, asked from a node it did not lose; {node: reason}
    of those drained. Nothing happens on a cluster without Slurm."""
    lost = lost_nodes(summary)
    asker = next((c for n, c in clients.items() if n not in lost and c.alive()), None)
    return drain(cluster, {node: f"{node} lost mid-run {summary.get('run_id')} ({why})"
                           for node, why in lost.items()}, str(summary.get("run_id")),
                 asker, say)


def drain(cluster: Cluster, reasons: Mapping[str, str], run_id: str,
          asker: ssh.Connection | None = None,
          say: Callable[[str], None] = print) -> dict[str, str]:
    """Drain each node of REASONS ({node: why}) in Slurm, asked from ASKER (else from a
    node of CLUSTER that is not to be drained); {node: reason} of those drained. Nothing
    happens on a cluster without Slurm."""
    if cluster.scheduler != "slurm" or not reasons:
        return {}
    own = None
    if asker is None:
        healthy = [n for n in cluster.nodes if n.name not in reasons]
        try:
            asker = own = ssh.connect(healthy[0].name, healthy[0].ssh) if healthy else None
        except ClusterError:
            asker = None
    if asker is None:
        say(f"run {run_id}: could not drain {', '.join(reasons)} in Slurm: no other node "
            "answers; an admin can: scontrol update NodeName=NODE State=DRAIN Reason=...")
        return {}
    drained = {}
    try:
        for node, reason in reasons.items():
            result = asker.run(shlex.join(["sudo", "-n", DRAIN, node, reason]), timeout=30)
            if result.exit_code == 0:
                drained[node] = reason
                say(f"run {run_id}: {node} is drained in Slurm ({reason}): the next "
                    "allocations avoid it; once it is fixed an admin returns it with "
                    f"`python -m orchestrator undrain {node}`")
            else:
                say(f"run {run_id}: could not drain {node} in Slurm "
                    f"({result.stderr.strip()[-200:] or result.exit_code}); is this user in "
                    "cluster_users (site.yml gives them clustertrain-drain)?")
    finally:
        if own is not None:
            own.close()
    return drained


def undrain(cluster: Cluster, node: str) -> str:
    """Return NODE to service (an admin: sudo on the node); what Slurm says of it now."""
    if node not in cluster.names:
        raise ClusterError(f"undrain {node}: not a node of {cluster.inventory} "
                           f"({', '.join(cluster.names)})")
    first = next((n for n in cluster.nodes if n.name != node), cluster.nodes[0])
    conn = ssh.connect(first.name, first.ssh)
    try:
        result = conn.run(shlex.join(["sudo", "-n", "scontrol", "update", f"NodeName={node}",
                                      "State=RESUME"]), timeout=30)
        if result.exit_code != 0:
            said = result.stderr.strip()[-300:]
            hint = ("only an admin (a user with sudo on the nodes) can return a node"
                    if "password" in said or "sudo" in said else said)
            raise ClusterError(f"undrain {node}: {hint}")
        state = conn.run(shlex.join(["sinfo", "-h", "-n", node, "-o", "%t %E"]), timeout=30)
    finally:
        conn.close()
    return state.stdout.strip()
