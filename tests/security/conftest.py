"""The attacks of a second user on the first one's work, on the real-site sandbox: bob (no
sudo) against alice's runs and files. Each test acts as bob the way he could on a real
site: a shell of his own on a cluster node (`as_user`), nothing more."""

from __future__ import annotations

import subprocess

from ..cluster import ProvisionedCluster


def as_user(cluster: ProvisionedCluster, node: str, user: str, script: str,
            check: bool = False, timeout: int = 120,
            stdin: str | None = None) -> subprocess.CompletedProcess:
    """SCRIPT (sh) run by USER in a login shell of their own on NODE, STDIN its input: what
    that user can do there, and no more (runuser drops every privilege; no sudo for bob)."""
    return subprocess.run(["podman", "exec", *(["-i"] if stdin is not None else []),
                           cluster.containers[node], "runuser", "-l", user, "-c", script],
                          input=stdin, capture_output=True, text=True, check=check,
                          timeout=timeout)
