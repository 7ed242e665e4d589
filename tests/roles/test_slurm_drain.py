"""The slurm role's clustertrain-drain, rendered and run as root for a user as sudo runs
it (SUDO_UID), against a stand-in scontrol (tests/orchestrator/node/test_cordon.py's): a
user changes only the drains he made. Another user's drain, and the health check's (root's:
roles/health), he can neither overwrite nor return to Slurm; an admin returns any."""

from __future__ import annotations

import time
from pathlib import Path

from orchestrator.node import cordon

from ..orchestrator.node import test_cordon
from ..orchestrator.node.test_cordon import BIN, DAEMON, as_root, calls, drained, helper_as, own

share = test_cordon.share          # the fixtures: a share with its cordon record,
scontrol = test_cordon.scontrol    # a stand-in scontrol

HEALTH = "clustertrain (health check): GPU 0 fell off the bus"


def cordoned_by(share: str, uid: int, lifted: bool = False) -> None:
    """UID's cordon of node1 in the share's record (lifted again by UID with LIFTED)."""
    cordon.record(share, "node1", cordon.CORDON, "mine now", now=time.time() - 20)
    own(share, uid)
    if lifted:
        cordon.record(share, "node1", cordon.UNCORDON, "fixed", now=time.time() - 10)
        own(share, uid)


@as_root
def test_a_user_cannot_take_over_the_health_checks_or_another_users_drain(
        share: str, scontrol: Path) -> None:
    """bin cordons node1 (anyone may), then drains it over the health check's drain: its
    reason stays the health check's, which the check resumes once it passes."""
    cordoned_by(share, BIN)
    for theirs in (HEALTH, "clustertrain (daemon): bad fan"):
        drained(scontrol, theirs)
        took = helper_as(BIN, share, scontrol, "node1", "mine now")
        assert took.returncode == 0, took.stderr
        assert took.stdout.strip() == f"node1 is drained already ({theirs}): left as it is"
        assert not [c for c in calls(scontrol) if c.startswith("update")], calls(scontrol)


@as_root
def test_a_user_changes_his_own_drain(share: str, scontrol: Path) -> None:
    cordoned_by(share, BIN)
    drained(scontrol, "clustertrain (bin): bad fan")
    done = helper_as(BIN, share, scontrol, "node1", "bad fan, and hot")
    assert done.returncode == 0, done.stderr
    assert calls(scontrol)[-1] == ("update NodeName=node1 State=DRAIN "
                                   "Reason=clustertrain (bin): bad fan, and hot")


@as_root
def test_a_user_returns_only_his_own_drain_and_an_admin_any(share: str,
                                                            scontrol: Path) -> None:
    """bin wrote a cordon of node1 and lifted it, which lets him return node1 to Slurm by
    the record's rule: not while the drain is the health check's or daemon's."""
    cordoned_by(share, BIN, lifted=True)
    for theirs, who in ((HEALTH, "health check"), ("clustertrain (daemon): bad fan", "daemon")):
        drained(scontrol, theirs)
        refused = helper_as(BIN, share, scontrol, "--resume", "node1")
        assert refused.returncode == 1, refused.stdout
        assert (f"node1 is drained by {who} ({theirs}): only {who} or an admin (a member "
                "of group 'daemon') returns it to Slurm") in refused.stderr, refused.stderr
        assert not [c for c in calls(scontrol) if c.startswith("update")], calls(scontrol)
    drained(scontrol, HEALTH)
    admin = helper_as(DAEMON, share, scontrol, "--resume", "node1")   # daemon: the admins
    assert admin.returncode == 0 and admin.stdout.strip() == "node1 returned to Slurm"
    drained(scontrol, "clustertrain (bin): bad fan")
    mine = helper_as(BIN, share, scontrol, "--resume", "node1")
    assert mine.returncode == 0 and mine.stdout.strip() == "node1 returned to Slurm"
