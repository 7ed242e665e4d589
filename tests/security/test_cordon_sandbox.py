"""bob against the cordon record and Slurm's drain, on the real-site sandbox: the files he
writes into the share's cordons/ in alice's name are his (or, dated in the future,
nobody's), his uncordon of alice's cordon is refused and a forged one lifts nothing, and
through the drain helper he drains no node he has not cordoned and returns none of hers.
alice is an admin (a member of the inventory's cluster_admin_group, sudo by default): she
lifts bob's cordon. The rule: roles/slurm/files/cordon.py."""

from __future__ import annotations

import json
import time

import pytest

from ..cluster import ProvisionedCluster
from ..orchestrator.run.test_real_site_sandbox import orchestrator
from .conftest import as_user

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]
NODE = "node2"   # cordoned for seconds only, and left as it was found
DRAIN = "/usr/local/sbin/clustertrain-drain"
FAR = 4102444800   # 2100-01-01T00:00:00Z
ADMIN_GROUP = "sudo"   # roles/contract's default cluster_admin_group


def forge(cluster: ProvisionedCluster, action: str, why: str, stamp: int | None) -> str:
    """bob writes NODE's event in alice's name (file name and content), dated STAMP (None:
    now); the file's name."""
    dated = stamp or int(time.time())
    name = f"{NODE}@{dated * 10**9}@alice.json"
    content = json.dumps({"node": NODE, "action": action, "why": why, "by": "alice",
                          "run": None, "time": dated, "since": "2100-01-01T00:00:00+00:00"})
    date = f"touch -d @{stamp} {name}" if stamp else "true"
    done = as_user(cluster, "node0", "bob", f"cd /mnt/cluster/cordons && printf '%s' "
                   f"'{content}' > {name} && chmod 644 {name} && {date}")
    assert done.returncode == 0, done.stderr
    return name


def slurm_state(cluster: ProvisionedCluster) -> str:
    return cluster.exec("node0", "sinfo", "-h", "-n", NODE, "-o", "%t %E").stdout.strip()


def listed(cluster: ProvisionedCluster) -> tuple[str, str]:
    """alice's `cordon`: its lines for NODE (stdout) and what it ignored (stderr)."""
    done = orchestrator("cordon", "-i", str(cluster.inventories["alice"]), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return ("\n".join(x for x in done.stdout.splitlines() if x.startswith(f"{NODE} ")),
            done.stderr)


def test_bobs_forged_cordons_are_his_and_lift_nothing_of_alices(
        sandbox_cluster: ProvisionedCluster) -> None:
    cordons = sandbox_cluster.share / "cordons"
    before = {p.name for p in cordons.iterdir()}
    was = slurm_state(sandbox_cluster)
    alice, bob = (str(sandbox_cluster.inventories[u]) for u in ("alice", "bob"))
    groups = sandbox_cluster.exec("node0", "id", "-nG", "alice").stdout.split()
    assert ADMIN_GROUP in groups, (
        f"alice is not in group {ADMIN_GROUP} on node0 ({groups}): the sandbox's image "
        "adds its sudo users to it (an admin, cluster_admin_group)")
    try:
        # A far-future cordon in alice's name: believed by nobody, said, refused by nobody.
        far = forge(sandbox_cluster, "cordon", "forged by bob", FAR)
        lines, ignored = listed(sandbox_cluster)
        assert lines == "", lines
        assert (f"ignored: {far} by bob: dated 2100-01-01T00:00:00+00:00, in the future"
                in ignored), ignored
        checked = orchestrator("preflight", "-i", alice, "--hosts", f"node0,{NODE}",
                               "--share-gpus", timeout=300)
        said = checked.stdout + checked.stderr
        assert f"{NODE}  {NODE}[" in said and f"{NODE}: cordoned" not in said, said

        # Dated now, it is a cordon: bob's, whatever it says; alice, an admin, lifts it.
        forge(sandbox_cluster, "cordon", "forged by bob", None)
        lines, _ = listed(sandbox_cluster)
        assert " by bob: forged by bob" in lines, lines
        back = orchestrator("uncordon", NODE, "-i", alice, timeout=120)
        assert back.returncode == 0, back.stdout + back.stderr
        assert listed(sandbox_cluster)[0] == ""

        # bob drains no node he has not cordoned.
        drained = as_user(sandbox_cluster, "node0", "bob", f"sudo -n {DRAIN} {NODE} 'bob'")
        assert drained.returncode == 1, drained.stdout + drained.stderr
        assert f"holds no cordon of {NODE} by bob" in drained.stderr, drained.stderr
        assert not slurm_state(sandbox_cluster).startswith("drain"), slurm_state(sandbox_cluster)

        # alice's cordon (and drain): bob may not lift it, nor return the node to Slurm,
        # and the uncordon he writes in her name lifts nothing.
        kept = orchestrator("cordon", NODE, "--why", "alice's test", "-i", alice, timeout=120)
        assert kept.returncode == 0, kept.stdout + kept.stderr
        assert slurm_state(sandbox_cluster).startswith("drain"), slurm_state(sandbox_cluster)
        files = {p.name for p in cordons.iterdir()}
        refused = orchestrator("uncordon", NODE, "-i", bob, timeout=120)
        assert refused.returncode != 0, refused.stdout + refused.stderr
        assert f"{NODE} is cordoned by alice since" in refused.stderr, refused.stderr
        assert "bob may not lift it: only an admin (a member of group 'sudo') or alice, " \
            "who cordoned it, may" in refused.stderr, refused.stderr
        assert {p.name for p in cordons.iterdir()} == files   # nothing written
        resumed = as_user(sandbox_cluster, "node0", "bob", f"sudo -n {DRAIN} --resume {NODE}")
        assert resumed.returncode == 1 and f"{NODE} is still cordoned by alice" in \
            resumed.stderr, resumed.stdout + resumed.stderr
        lift = forge(sandbox_cluster, "uncordon", "forged by bob", None)
        lines, ignored = listed(sandbox_cluster)
        assert " by alice: alice's test" in lines, lines
        assert f"ignored: {lift} by bob: an uncordon of {NODE} by someone who may not " \
            "lift its cordon" in ignored, ignored
        assert slurm_state(sandbox_cluster).startswith("drain")

        # Hers to lift: the record, then Slurm (the helper, as its author).
        back = orchestrator("uncordon", NODE, "-i", alice, timeout=120)
        assert back.returncode == 0, back.stdout + back.stderr
        assert not slurm_state(sandbox_cluster).startswith("drain"), slurm_state(sandbox_cluster)
    finally:   # the node as it was found, for the tests that share this cluster
        for name in {p.name for p in cordons.iterdir()} - before:
            (cordons / name).unlink()
        if slurm_state(sandbox_cluster).startswith("drain") and not was.startswith("drain"):
            sandbox_cluster.exec("node0", "scontrol", "update", f"NodeName={NODE}",
                                 "State=RESUME")
