"""bob against the health check's drain, on the real-site sandbox: the health check (root,
roles/health) drained a node ("clustertrain (health check): why"); bob cordons it (anyone may)
and drains it through the helper, which overwrote the reason with his, so that the check,
once passing, no longer resumed it, and the node stayed drained with no cordon anywhere.
Now the helper changes only the caller's own drains: bob's drain leaves the reason as it
is, and he cannot return the node to Slurm. The rule: roles/slurm/templates/
clustertrain-drain.j2 over roles/slurm/files/cordon.py."""

from __future__ import annotations

import pytest

from ..cluster import ProvisionedCluster, orchestrator
from .conftest import as_user

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]
NODE = "node2"   # drained for seconds only, and left as it was found
DRAIN = "/usr/local/sbin/clustertrain-drain"
HEALTH = "clustertrain (health check): test: GPU 0 fell off the bus"


def reason(cluster: ProvisionedCluster) -> str:
    return cluster.exec("node0", "sinfo", "-h", "-n", NODE, "-o", "%t %E").stdout.strip()


def test_bob_can_neither_take_over_nor_return_the_health_checks_drain(
        sandbox_cluster: ProvisionedCluster) -> None:
    cordons = sandbox_cluster.share / "cordons"
    before = {p.name for p in cordons.iterdir()}
    was = reason(sandbox_cluster)
    bob = str(sandbox_cluster.inventories["bob"])
    sandbox_cluster.exec("node0", "scontrol", "update", f"NodeName={NODE}", "State=DRAIN",
                         f"Reason={HEALTH}")   # as the health check drains, as root
    try:
        kept = orchestrator("cordon", NODE, "--why", "bob's", "-i", bob, timeout=120)
        assert kept.returncode == 0, kept.stdout + kept.stderr
        took = as_user(sandbox_cluster, "node0", "bob", f"sudo -n {DRAIN} {NODE} 'mine now'")
        assert took.returncode == 0, took.stdout + took.stderr
        assert "left as it is" in took.stdout, took.stdout
        assert HEALTH in reason(sandbox_cluster), reason(sandbox_cluster)
        back = orchestrator("uncordon", NODE, "-i", bob, timeout=120)   # his own cordon
        assert back.returncode != 0 and f"{NODE} is drained by health" in back.stderr, \
            back.stdout + back.stderr
        resumed = as_user(sandbox_cluster, "node0", "bob", f"sudo -n {DRAIN} --resume {NODE}")
        assert resumed.returncode == 1, resumed.stdout + resumed.stderr
        assert f"{NODE} is drained by health" in resumed.stderr, resumed.stderr
        assert HEALTH in reason(sandbox_cluster), reason(sandbox_cluster)
    finally:   # the node as it was found, for the tests that share this cluster
        for name in {p.name for p in cordons.iterdir()} - before:
            (cordons / name).unlink()
        if not was.startswith("drain"):
            sandbox_cluster.exec("node0", "scontrol", "update", f"NodeName={NODE}",
                                 "State=RESUME", check=False)
