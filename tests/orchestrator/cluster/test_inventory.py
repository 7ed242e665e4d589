"""Reading the cluster from an Ansible inventory, INI and YAML, through Ansible's loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cluster.inventory import load_cluster
from orchestrator.errors import InventoryError

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
    assert (b.host, b.cluster_address, b.ssh.port, b.user) == ("192.0.2.12", "10.10.0.12",
                                                               2222, "trainer")
    # No port anywhere: OpenSSH decides (~/.ssh/config, else 22), as with Ansible.
    assert (a.cluster_address, a.ssh.port) == ("192.0.2.11", None)
    assert a.ssh.private_key_file == str(Path("~/.ssh/cluster_key").expanduser())
    assert a.ssh.common_args == ("-o", "UserKnownHostsFile=/etc/ct/known_hosts",
                                 "-o", "StrictHostKeyChecking=yes")
    assert cluster.rendezvous_port == 29600
    assert cluster.shared_path == "/mnt/cluster"


def test_yaml_inventory_with_template(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, "hosts.yml", YAML))
    assert cluster.names == ["n0", "n1"]
    assert cluster.nodes[1].cluster_address == "10.0.0.6"
    assert cluster.nodes[0].ssh.common_args == ("-o", "StrictHostKeyChecking=accept-new")
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


def test_dns_names_are_addresses(tmp_path: Path) -> None:
    # Names are resolved later, on the nodes (preflight), where the cluster's DNS answers.
    inv = write(tmp_path, "dns.ini", "[train_nodes]\ngpu0.example.org\n"
                "gpu1 ansible_host=gpu1.example.org cluster_address=gpu1-ib.example.org\n")
    n0, n1 = load_cluster(inv).nodes
    assert (n0.host, n0.cluster_address) == ("gpu0.example.org", "gpu0.example.org")
    assert (n1.host, n1.cluster_address) == ("gpu1.example.org", "gpu1-ib.example.org")


def test_ssh_options_come_from_ansible_config_and_host_vars(tmp_path: Path, monkeypatch) -> None:
    # ansible.cfg's remote_user / private_key_file / ssh_args apply unless the host
    # overrides them, exactly as for ansible-playbook.
    cfg = write(tmp_path, "ansible.cfg", "[defaults]\nremote_user = carol\n"
                "private_key_file = /keys/id\nhost_key_checking = false\n"
                "[ssh_connection]\nssh_args = -o ControlPersist=10s\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(cfg))
    import importlib

    import ansible.constants as C
    importlib.reload(C)
    try:
        inv = write(tmp_path, "h.ini", "[train_nodes]\nn0 ansible_host=192.0.2.1\n"
                    "n1 ansible_host=192.0.2.2 ansible_user=dave "
                    "ansible_ssh_common_args='-o ProxyJump=bastion.example.org'\n")
        n0, n1 = load_cluster(inv).nodes
    finally:
        monkeypatch.delenv("ANSIBLE_CONFIG")
        importlib.reload(C)
    assert (n0.user, n0.ssh.private_key_file, n0.ssh.host_key_checking) == (
        "carol", "/keys/id", False)
    assert n0.ssh.ssh_args == ("-o", "ControlPersist=10s")
    assert n1.user == "dave" and n1.ssh.common_args == ("-o", "ProxyJump=bastion.example.org")
    argv = n1.ssh.options()
    # Ansible's order: ssh_args first, then its own options, then the host's common args.
    assert argv.index("ControlPersist=10s") < argv.index("User=dave") < argv.index(
        "ProxyJump=bastion.example.org")
    assert "StrictHostKeyChecking=no" in argv


def test_a_paramiko_host_is_reached_with_the_paramiko_plugins_settings(tmp_path: Path) -> None:
    """ansible_connection: paramiko: its own variables (user, port, host, proxy command)
    decide where the orchestrator's OpenSSH goes, as they decide where Ansible goes."""
    inv = write(tmp_path, "p.yml", """\
all:
  children:
    train_nodes:
      vars:
        ansible_connection: paramiko
        ansible_paramiko_user: erin
        ansible_paramiko_proxy_command: ssh -W %h:%p jump.example.org
      hosts:
        n0: {ansible_paramiko_host: 192.0.2.7, ansible_paramiko_port: 2200}
        n1: {ansible_host: 192.0.2.8, ansible_connection: ssh, ansible_user: frank}
""")
    n0, n1 = load_cluster(inv).nodes
    assert (n0.ssh.host, n0.ssh.port, n0.user) == ("192.0.2.7", 2200, "erin")
    argv = n0.ssh.options()
    assert argv[argv.index("ProxyCommand=ssh -W %h:%p jump.example.org") - 1] == "-o"
    assert argv.index("User=erin") < argv.index("ProxyCommand=ssh -W %h:%p jump.example.org")
    # the other host says ssh: the paramiko settings of the group are not its
    assert (n1.ssh.host, n1.user, n1.ssh.proxy_command) == ("192.0.2.8", "frank", None)


@pytest.mark.parametrize("connection", ["local", "community.docker.docker"])
def test_a_training_node_that_ansible_does_not_reach_over_ssh_is_refused(
        tmp_path: Path, connection: str) -> None:
    inv = write(tmp_path, "l.ini", f"[train_nodes]\nn0 ansible_connection={connection}\n")
    with pytest.raises(InventoryError, match=rf"n0: ansible_connection is '{connection}' in "
                       r".*does not log in over SSH.*use ssh \(Ansible's default\) or paramiko"):
        load_cluster(inv)


def test_template_that_needs_facts_names_variable_and_host(tmp_path: Path) -> None:
    inv = write(tmp_path, "facts.yml", """\
all:
  children:
    train_nodes:
      hosts:
        n0: {ansible_host: 192.0.2.1, cluster_address: "{{ ansible_default_ipv4.address }}"}
""")
    with pytest.raises(InventoryError, match=r"n0: cluster_address = .*ansible_default_ipv4"
                       r".* cannot be rendered .*set cluster_address for n0 to a value"):
        load_cluster(inv)


def test_two_hosts_with_one_address_are_refused(tmp_path: Path) -> None:
    inv = write(tmp_path, "dup.ini", "[train_nodes]\nn0 ansible_host=192.0.2.1\n"
                "n1 ansible_host=192.0.2.1\n")
    with pytest.raises(InventoryError, match=r"n0 and n1 .* have the same cluster_address "
                       r"\(192.0.2.1\); each training node must be a different machine"):
        load_cluster(inv)


def test_unparseable_inventory_shows_ansibles_error(tmp_path: Path) -> None:
    inv = write(tmp_path, "broken.yml", "all:\n  hosts:\n    n0: [unclosed\n")
    with pytest.raises(InventoryError) as err:
        load_cluster(inv)
    text = str(err.value)
    assert f"Ansible cannot parse the inventory {inv}" in text
    assert "yaml" in text.lower() and "no hosts" not in text


@pytest.mark.parametrize("hosts", ["", ",", " , "])
def test_hosts_naming_nothing_is_refused(tmp_path: Path, hosts: str) -> None:
    cluster = load_cluster(write(tmp_path, "hosts.ini", INI))
    with pytest.raises(InventoryError, match=r"--hosts .* names no node; .*--hosts gpu-b,gpu-a"):
        cluster.select(hosts=hosts)


@pytest.mark.parametrize("value", ["lots", "-1", ".nan"])
def test_a_space_minimum_that_is_not_a_number_of_gib_is_refused(tmp_path: Path,
                                                                value: str) -> None:
    assert load_cluster(write(tmp_path, "hosts.ini", INI)).min_free_gb == 2.0
    inv = write(tmp_path, "space.yml", YAML.replace(
        "    cluster_shared_path: /data/shared\n",
        f"    cluster_shared_path: /data/shared\n    cluster_min_free_gb: {value}\n"))
    with pytest.raises(InventoryError, match=r"cluster_min_free_gb in .*space.yml: .*give the "
                       r"GiB a run needs free .* a number of 0 or more \(default 2\)"):
        load_cluster(inv)
    ok = write(tmp_path, "ok.yml", YAML.replace(
        "    cluster_shared_path: /data/shared\n",
        "    cluster_shared_path: /data/shared\n    cluster_min_free_gb: 0.5\n"))
    assert load_cluster(ok).min_free_gb == 0.5
