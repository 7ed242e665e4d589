"""The whole site.yml's promise, on the shared cluster it provisioned: molecule's
`default` and `slurm` scenarios' checks (molecule/default/verify.yml,
molecule/slurm/verify.yml), run against the sandbox that the orchestrator's tests use, so
that `make test` converges site.yml once, not three times. `make molecule
SCENARIO=default` (or slurm) still runs them on a cluster of their own."""

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


def test_slurm_serves_every_nodes_gpus_with_a_queue_accounting_and_fair_share(sandbox_cluster):
    """site.yml with cluster_scheduler: slurm, as the sudo user: every node idle with its
    (fake) GPUs; bob's job gets one GPU per node; a job that asks for a GPU in use waits
    until it is free; accounting counts each job's GPUs; alice and bob have fair shares;
    the per-user GPU limit is the partition's QOS; the outsider cannot reach slurmctld."""
    proc = run(str(BIN / "ansible-playbook"), "-i", str(sandbox_cluster.inventory),
               "molecule/slurm/verify.yml", timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    failed = {host: counts["failed"] for host, counts in play_recap(proc.stdout).items()}
    assert failed == {next(iter(sandbox_cluster.nodes)): 0,
                      list(sandbox_cluster.nodes)[-1]: 0, "outsider0": 0}, failed
