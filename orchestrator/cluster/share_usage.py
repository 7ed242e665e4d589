"""What the share holds and who used the cluster: `du`'s and `usage`'s core. Both read the
share on the first node (every node sees the same share), as the caller (what their
permissions let them read), or as root through sudo (EVERYONE: an admin's view of every
user's directories)."""

from __future__ import annotations

from typing import TypeVar

from ..errors import ClusterError
from ..node.answers import DuAnswer, UsageAnswer
from ..node.requests import Du, Request, Usage
from . import nodelib, ssh
from .inventory import Cluster

WALK_TIMEOUT = 1800.0   # seconds: a share of millions of files takes minutes to walk
A = TypeVar("A")


def read_share(cluster: Cluster, request: Request[A], everyone: bool = False) -> A:
    """REQUEST (of the share: du, usage) on the first node, its answer; ClusterError naming
    the node and its words if it cannot be read (for EVERYONE without sudo: the fix)."""
    first, verb = cluster.nodes[0], request.VERB
    conn = ssh.connect(first.name, first.ssh)
    try:
        return nodelib.ask(conn, first.python, request, node=first.name,
                           timeout=WALK_TIMEOUT, sudo=everyone)
    except nodelib.NodeAnswerError as exc:
        if everyone and exc.exit_code != 0 and "sudo" in exc.said:
            raise ClusterError(f"{verb} --all reads every user's directories as root, "
                               f"through sudo on {first.name}, which refused: {exc.said}. "
                               f"It is for an admin (passwordless sudo); without --all, "
                               f"{verb} shows what you may read") from None
        raise ClusterError(f"{first.name}: cannot read the share {cluster.shared_path}: "
                           f"{exc.said}") from None
    finally:
        conn.close()


def share_usage(cluster: Cluster, everyone: bool = False) -> DuAnswer:
    """The share's bytes by owner and kind (node/du.py counts them)."""
    return read_share(cluster, Du(cluster.shared_path), everyone=everyone)


def run_usage(cluster: Cluster, since: float, everyone: bool = False) -> UsageAnswer:
    """Node- and GPU-hours per user and run since SINCE (node/usage.py counts them)."""
    request = Usage(cluster.shared_path, since,
                    sacct=cluster.scheduler == "slurm")   # and Slurm's own word
    return read_share(cluster, request, everyone=everyone)
