"""Who fills the share, and with what: `clustertrain du`'s core. The share is read on the
first node (every node sees the same share), as the caller (what their permissions let
them read), or with ALL as root through sudo (an admin: everyone's directories)."""

from __future__ import annotations

import json
from typing import Any

from ..errors import ClusterError
from . import nodelib, ssh
from .inventory import Cluster

WALK_TIMEOUT = 1800.0   # seconds: a share of millions of files takes minutes to walk


def share_usage(cluster: Cluster, everyone: bool = False) -> dict[str, Any]:
    """node.py du on the first node (node/du.py has the fields); ClusterError naming the
    node and its words if it cannot be read (for EVERYONE: without sudo, the fix)."""
    first = cluster.nodes[0]
    conn = ssh.connect(first.name, first.ssh)
    try:
        result = nodelib.call(conn, first.python, "du", cluster.shared_path,
                              timeout=WALK_TIMEOUT, sudo=everyone)
    finally:
        conn.close()
    if result.exit_code != 0:
        said = (result.stderr.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
        if everyone and "sudo" in said:
            raise ClusterError(f"du --all reads every user's directories as root, through "
                               f"sudo on {first.name}, which refused: {said}. It is for an "
                               "admin (passwordless sudo); without --all, du shows what "
                               "you may read")
        raise ClusterError(f"{first.name}: cannot read the share {cluster.shared_path}: "
                           f"{said}")
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found
