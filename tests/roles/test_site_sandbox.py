"""The whole site.yml's promise, on the shared cluster it provisioned: the checks of
molecule's `default`, `slurm` and `python_env` scenarios (their
verify.yml; the others converge the same playbooks site.yml runs, with the same sandbox
group_vars), run against the sandbox that the orchestrator's tests use, so that `make test`
converges site.yml once (and its second run, changed=0, is
tests/packaging/test_installed_sandbox.py's). `make molecule SCENARIO=NAME` still runs
each on a cluster of its own."""

from __future__ import annotations

import pytest

from ..cluster import BIN, ENV, REPO, play_recap, run

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


def test_every_node_runs_the_one_environment_and_drift_is_named(sandbox_cluster, tmp_path):
    """molecule/python_env/verify.yml: the same environment on every node from the
    wheelhouse, the file byte for byte, equal fingerprints; drift on one node named by
    playbooks/verify.yml; the venv backend's refusals before anything changes."""
    env = {**ENV, "MOLECULE_PROJECT_DIRECTORY": str(REPO),
           "MOLECULE_EPHEMERAL_DIRECTORY": str(tmp_path),
           "CLUSTERTRAIN_VERIFY_INVENTORY": str(sandbox_cluster.inventory)}
    proc = run(str(BIN / "ansible-playbook"), "-i", str(sandbox_cluster.inventory),
               "molecule/python_env/verify.yml", timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    failed = {h: c["failed"] for h, c in play_recap(proc.stdout).items() if c["failed"]}
    assert not failed and set(play_recap(proc.stdout)) >= set(sandbox_cluster.nodes), failed

