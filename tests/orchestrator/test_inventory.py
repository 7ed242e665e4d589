"""Reading the cluster from an Ansible inventory, INI and YAML, through Ansible's loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import InventoryError
from orchestrator.inventory import load_cluster

INI = """\
[train_nodes]
gpu-b ansible_host=192.0.2.12 cluster_address=10.10.0.12 ansible_port=2222
gpu-a ansible_host=192.0.2.11
gpu-c ansible_host=192.0.2.13

[cluster:children]
train_nodes

[all:vars]
ansible_user=trainer
ansible_ssh_private_key_file=~/.ssh/cluster_key
ansible_ssh_common_args='-o UserKnownHostsFile=/etc/ct/known_hosts -o StrictHostKeyChecking=yes'
cluster_rendezvous_port=29600
"""

YAML = """\
all:
  vars:
    ansible_user: root
    ansible_ssh_common_args: -o StrictHostKeyChecking=accept-new
    cluster_shared_path: /data/shared
  children:
    cluster:
      children:
        train_nodes:
          hosts:
            n0: {ansible_host: 198.51.100.5}
            n1: {ansible_host: 198.51.100.6, cluster_address: "{{ '10.0.0.' ~ 6 }}"}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_ini_inventory(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, "hosts.ini", INI))
    # Order is the inventory's: the first host is node 0.
    assert cluster.names == ["gpu-b", "gpu-a", "gpu-c"]
    b, a, _ = cluster.nodes
    assert (b.host, b.cluster_address, b.port, b.user) == ("192.0.2.12", "10.10.0.12", 2222,
                                                           "trainer")
    assert (a.cluster_address, a.port) == ("192.0.2.11", 22)
    assert a.key_file == str(Path("~/.ssh/cluster_key").expanduser())
    assert a.known_hosts == "/etc/ct/known_hosts" and a.host_key_checking == "yes"
    assert cluster.rendezvous_port == 29600
    assert cluster.shared_path == "/mnt/cluster"


def test_yaml_inventory_with_template(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, "hosts.yml", YAML))
    assert cluster.names == ["n0", "n1"]
    assert cluster.nodes[1].cluster_address == "10.0.0.6"
    assert cluster.nodes[0].host_key_checking == "accept-new"
    assert cluster.nodes[0].known_hosts is None
    assert cluster.shared_path == "/data/shared"
    assert cluster.rendezvous_port == 29500


def test_group_vars_next_to_inventory_apply(tmp_path: Path) -> None:
    (tmp_path / "group_vars").mkdir()
    write(tmp_path / "group_vars", "all.yml", "cluster_rendezvous_port: 30000\n")
    cluster = load_cluster(write(tmp_path, "hosts.yml", YAML))
    assert cluster.rendezvous_port == 30000


def test_select_first_n_and_by_name(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, "hosts.ini", INI))
    assert cluster.select(nodes=2).names == ["gpu-b", "gpu-a"]
    # --hosts keeps inventory order, so node 0 stays the inventory's first chosen host.
    assert cluster.select(hosts="gpu-c,gpu-b").names == ["gpu-b", "gpu-c"]


def test_nodes_larger_than_inventory(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, "hosts.ini", INI))
    with pytest.raises(InventoryError, match=r"--nodes 5: .* has only 3 node\(s\)"):
        cluster.select(nodes=5)


def test_unknown_host(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, "hosts.ini", INI))
    with pytest.raises(InventoryError, match="unknown host.*gpu-z.*gpu-b, gpu-a, gpu-c"):
        cluster.select(hosts="gpu-a,gpu-z")


def test_missing_inventory_and_empty_group(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="does not exist.*-i/--inventory"):
        load_cluster(tmp_path / "nope.yml")
    with pytest.raises(InventoryError, match="no hosts in group 'train_nodes'"):
        load_cluster(write(tmp_path, "empty.ini", "[other]\nx ansible_host=192.0.2.1\n"))


def test_cluster_address_must_be_ip(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.ini", "[train_nodes]\nn0 ansible_host=gpu0.example.org\n")
    with pytest.raises(InventoryError, match="n0: cluster_address 'gpu0.example.org' is not an IP"):
        load_cluster(bad)
