"""An inventory that says `ansible_connection: paramiko` on the 3-node sandbox: the nodes
are reached only through the bastion, and this inventory names the way through it only
in paramiko's words (ansible_paramiko_proxy_command; no ssh_config, no ProxyJump). Every
part of `train` must follow it: preflight and the launch (the orchestrator's OpenSSH),
the sync's Ansible tasks (the paramiko plugin) and its rsync (the orchestrator's SSH
again). Before, the sync's rsync went straight to the node's address and timed out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from ...cluster import ProvisionedCluster as Sandbox
from ..run.test_real_site_sandbox import orchestrator
from ..run.test_supervision_sandbox import JOBS, cli

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]


def paramiko_inventory(sandbox_cluster: Sandbox, path: Path) -> Path:
    """alice's inventory, with paramiko as its connection and its own words for the way
    in. Paramiko reads only ~/.ssh/known_hosts, which the sandbox leaves alone: its host
    key checking is off here (the proxy's hop, OpenSSH's, still checks the bastion's)."""
    status = orchestrator("sandbox", "status", "--name", sandbox_cluster.name, "--json")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    inventory = yaml.safe_load(sandbox_cluster.inventory.read_text())
    settings = inventory["all"]["vars"]
    del settings["ansible_ssh_common_args"], settings["ansible_control_path_dir"]
    settings.update(
        ansible_connection="paramiko", ansible_ssh_private_key_file=info["key"],
        ansible_host_key_checking=False,
        ansible_paramiko_proxy_command=f"ssh -F {info['ssh_config']} -W %h:%p "
                                       f"{info['bastion']['name']}")
    hosts = inventory["all"]["children"]["cluster"]["children"]["train_nodes"]["hosts"]
    for name, address in sandbox_cluster.nodes.items():
        hosts[name]["ansible_host"] = address
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return path


def test_train_on_an_inventory_that_says_paramiko(sandbox_cluster: Sandbox,
                                                  tmp_path: Path) -> None:
    inventory = paramiko_inventory(sandbox_cluster, tmp_path / "paramiko.yml")
    work = shutil.copytree(JOBS, tmp_path / "code")   # new code: the sync's playbook runs
    done = cli(sandbox_cluster, tmp_path / "runs", "train", "-i", str(inventory),
               "--workdir", str(work), "--nodes", "3", "ddp_allreduce.py", "--",
               "--steps", "2", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "code synced in" in done.stdout, done.stdout
    for rank in range(3):
        assert f"rank {rank}/3 host node{rank} sum 6 ok" in done.stdout, done.stdout
