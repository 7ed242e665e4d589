"""`clustertrain du` on the real share, as two real users: bob sees his own bytes and that
alice's directory is not his to read; alice, an admin, sees everyone's with --all (as root,
through sudo), which bob is refused."""

from __future__ import annotations

import json
import secrets

import pytest

from ...cluster import ProvisionedCluster, orchestrator

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]


def test_du_shows_each_user_their_own_and_an_admin_everyones(
        sandbox_cluster: ProvisionedCluster) -> None:
    bob = sandbox_cluster.inventories["bob"]
    name = f"du-{secrets.token_hex(3)}"
    mine, hers = (f"/mnt/cluster/checkpoints/{u}/{name}" for u in ("bob", "alice"))
    for user, path, mib in (("bob", mine, 6), ("alice", hers, 2)):
        sandbox_cluster.exec("node1", "runuser", "-u", user, "--", "sh", "-ec",
                             f"mkdir -p {path} && head -c {mib}M /dev/urandom > {path}/step.pt")
    try:
        as_bob = orchestrator("du", "--json", "-i", str(bob), timeout=300)
        assert as_bob.returncode == 0, as_bob.stdout + as_bob.stderr
        seen = json.loads(as_bob.stdout)
        assert seen["users"]["bob"]["checkpoints"] >= 6 << 20, seen["users"]
        unread = {u["path"]: u["owner"] for u in seen["unread"]}
        assert unread.get("/mnt/cluster/checkpoints/alice") == "alice", seen["unread"]
        shown = orchestrator("du", "-i", str(bob), timeout=300)
        assert "not read: /mnt/cluster/checkpoints/alice (owned by alice): Permission " \
            "denied; an admin sees it with du --all" in shown.stdout, shown.stdout

        refused = orchestrator("du", "--all", "-i", str(bob), timeout=300)
        assert refused.returncode != 0
        assert "du --all reads every user's directories as root, through sudo on node0, " \
            "which refused" in refused.stderr, refused.stderr

        admin = orchestrator("du", "--all", "--json", "-i", str(sandbox_cluster.inventory),
                             timeout=300)
        assert admin.returncode == 0, admin.stdout + admin.stderr
        everyone = json.loads(admin.stdout)
        assert everyone["unread"] == [], everyone["unread"]
        assert everyone["users"]["bob"]["checkpoints"] >= 6 << 20
        assert everyone["users"]["alice"]["checkpoints"] >= 2 << 20   # unread by bob
        assert everyone["total"] > everyone["free"] > 0
    finally:
        sandbox_cluster.exec("node1", "rm", "-rf", mine, hers, check=False)
