"""The whole site.yml's promise, on the shared cluster it provisioned: molecule's
`default` scenario's checks (molecule/default/verify.yml), run against the sandbox that
the orchestrator's tests use, so that `make test` converges site.yml once, not twice.
`make molecule SCENARIO=default` still runs them on a cluster of their own."""

from __future__ import annotations

import pytest

from ..cluster import BIN, play_recap, run

pytestmark = pytest.mark.sandbox


def test_the_provisioned_cluster_keeps_every_roles_promise(sandbox_cluster):
    """Every training node resolves every other by name and takes its time from node0;
    node0's SSH, NFS and rendezvous ports are open to the members and closed to the
    outsider; the members read the export over NFS and the outsider, with a client of
    its own, reads nothing; every node imports the same torch and has the same
    environment fingerprint."""
    proc = run(str(BIN / "ansible-playbook"), "-i", str(sandbox_cluster.inventory),
               "molecule/nfs/prepare.yml", "molecule/default/verify.yml", timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    failed = {host: counts["failed"] for host, counts in play_recap(proc.stdout).items()}
    assert failed == {**{node: 0 for node in sandbox_cluster.nodes}, "outsider0": 0}, failed
