"""Reading the cluster from an Ansible inventory, INI and YAML, through Ansible's loader."""

from __future__ import annotations

import re
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


# --- every value is checked at the door (issue 66) ---------------------------------------

def _load_then_connect(inv: Path) -> str:
    """What `preflight` does with an inventory: load it, then connect to each node; the
    error the user is shown ("" if none came from loading)."""
    from orchestrator.cluster import ssh
    from orchestrator.errors import PreflightError

    try:
        cluster = load_cluster(inv)
    except InventoryError as exc:
        return str(exc)
    for node in cluster.nodes:
        try:
            ssh.connect(node.name, node.ssh, within=10).close()
        except PreflightError:
            pass
    return ""


@pytest.mark.parametrize("where", ["ini ansible_host", "yaml ansible_host", "yaml name"])
def test_a_host_that_ssh_would_read_as_an_option_is_refused_and_never_run(
        tmp_path: Path, where: str) -> None:
    pwned = tmp_path / "pwned"
    host = f"-oProxyCommand=touch {pwned}"
    if where == "ini ansible_host":
        inv = write(tmp_path, "h.ini", f"[train_nodes]\nn0 ansible_host='{host}'\n")
    elif where == "yaml ansible_host":
        inv = write(tmp_path, "h.yml",
                    f"train_nodes:\n  hosts:\n    n0: {{ansible_host: '{host}'}}\n")
    else:
        inv = write(tmp_path, "h.yml", f"train_nodes:\n  hosts:\n    '{host}':\n")
    said = _load_then_connect(inv)
    assert not pwned.exists()
    name = "n0" if where != "yaml name" else host
    variable = "ansible_host" if where != "yaml name" else "inventory name"
    assert said.startswith(f"{name}: {variable} in {inv}: '{host}' is not a host name or "
                           "an IP address; give a host name (letters, digits"), said


@pytest.mark.parametrize(("hostvars", "variable", "said"), [
    ("ansible_host: 'gpu 1'", "ansible_host", "'gpu 1' is not a host name"),
    ("ansible_host: 'root@10.0.0.1'", "ansible_host", "'root@10.0.0.1' is not a host name"),
    ("ansible_host: 'a;b'", "ansible_host", "'a;b' is not a host name"),
    ("ansible_host: 10.0.0.300", "ansible_host", "'10.0.0.300' is not a host name"),
    ("ansible_host: [10.0.0.1]", "ansible_host", "must be text, not a list"),
    ("ansible_user: '-oProxyCommand=x'", "ansible_user", "'-oProxyCommand=x' is not a login"),
    ("ansible_user: 'bob smith'", "ansible_user", "'bob smith' is not a login name"),
    ("ansible_user: 'a$(id)'", "ansible_user", "'a$(id)' is not a login name"),
    ("ansible_user: [a]", "ansible_user", "must be text, not a list"),
])
def test_a_host_or_user_that_is_not_plausible_is_refused(tmp_path: Path, hostvars: str,
                                                         variable: str, said: str) -> None:
    inv = write(tmp_path, "h.yml", f"train_nodes:\n  hosts:\n    n0: {{{hostvars}}}\n")
    with pytest.raises(InventoryError) as err:
        load_cluster(inv)
    assert str(err.value).startswith(f"n0: {variable} in {inv}: {said}"), str(err.value)


def test_a_name_with_a_leading_dash_is_refused(tmp_path: Path) -> None:
    inv = write(tmp_path, "h.ini", "[train_nodes]\n-gpu0 ansible_host=10.0.0.1\n")
    with pytest.raises(InventoryError, match=r"-gpu0: inventory name in .*h.ini: '-gpu0' is "
                       r"not a host name .*; rename the host"):
        load_cluster(inv)


def test_plausible_hosts_and_users_are_taken(tmp_path: Path) -> None:
    inv = write(tmp_path, "h.yml", """\
train_nodes:
  hosts:
    gpu_0.example.org: {ansible_user: svc.train-1}
    n1: {ansible_host: "fe80::1%eth0", ansible_user: "alice@example.org"}
    n2: {ansible_host: 2001:db8::2, cluster_address: "[2001:db8::12]"}
    n3: {ansible_host: gpu-3, cluster_address: gpu-3.ib.example.org.}
""")
    nodes = load_cluster(inv).nodes
    assert [n.host for n in nodes] == ["gpu_0.example.org", "fe80::1%eth0", "2001:db8::2",
                                       "gpu-3"]
    assert [n.user for n in nodes[:2]] == ["svc.train-1", "alice@example.org"]


@pytest.mark.parametrize("port", ["0", "-22", "70000", "22abc", "true", "22.5"])
def test_an_ssh_port_that_is_not_a_port_is_refused(tmp_path: Path, port: str) -> None:
    inv = write(tmp_path, "h.yml", f"train_nodes:\n  hosts:\n    n0: {{ansible_port: {port}}}\n")
    with pytest.raises(InventoryError, match=rf"n0: ansible_port in .*h.yml: "
                       rf"'?{port if port != 'true' else 'True'}'? is not a port; give a whole "
                       r"number 1-65535"):
        load_cluster(inv)


@pytest.mark.parametrize(("variable", "value", "near", "allowed"), [
    ("cluster_scheduler", "slrum", "slurm", "none, slurm"),
    ("python_env_backend", "vnev", "venv", "conda, venv"),
])
def test_a_misspelt_choice_is_refused_with_did_you_mean(tmp_path: Path, variable: str,
                                                        value: str, near: str,
                                                        allowed: str) -> None:
    inv = write(tmp_path, "h.ini", f"[train_nodes]\nn0\n[all:vars]\n{variable}={value}\n")
    with pytest.raises(InventoryError, match=rf"{variable} in .*h.ini: '{value}' is not "
                       rf"one of {allowed} \(did you mean '{near}'\?\)"):
        load_cluster(inv)


@pytest.mark.parametrize("address", ["not an address!", "-x", "10.0.0.300", "a..b"])
def test_a_junk_cluster_address_is_refused(tmp_path: Path, address: str) -> None:
    inv = write(tmp_path, "h.yml", "train_nodes:\n  hosts:\n"
                f"    n0: {{ansible_host: 10.0.0.1, cluster_address: '{address}'}}\n")
    with pytest.raises(InventoryError, match=rf"n0: cluster_address in .*h.yml: "
                       rf"'{re.escape(address)}' is not a host name or an IP address"):
        load_cluster(inv)


@pytest.mark.parametrize("port", ["80", "0", "1023", "65536", "'29500x'", "true"])
def test_a_privileged_or_impossible_rendezvous_port_is_refused(tmp_path: Path,
                                                               port: str) -> None:
    inv = write(tmp_path, "h.yml", f"all:\n  vars:\n    cluster_rendezvous_port: {port}\n"
                "  children:\n    train_nodes:\n      hosts:\n        n0:\n")
    with pytest.raises(InventoryError, match=r"cluster_rendezvous_port in .*h.yml: .* is not an "
                       r"unprivileged port; give a whole number 1024-65535 \(the users' "
                       r"training processes bind it.*default 29500"):
        load_cluster(inv)


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("cluster_admin_group", "'bad group!'", "'bad group!' is not a group name"),
    ("cluster_admin_group", "[wheel, sudo]", "must be text, not a list"),
    ("cluster_admin_group", "1000", "1000 is not a group name"),
    ("cluster_shared_path", "relative/dir", "'relative/dir' is not an absolute path"),
    ("cluster_shared_path", "{a: 1}", "must be text, not a mapping"),
    ("nfs_client_kernel_mount", "maybe", "'maybe' is not true or false"),
    ("cluster_shared_fstypes", "{nfs: 4}", "must be a type or a list of types, not a mapping"),
    ("cluster_scheduler", "[slurm]", "must be text, not a list"),
    ("cluster_rendezvous_port_span", "[1]", "must be a whole number, not a list"),
    ("python_env_state_dir", "[a]", "must be text, not a list"),
    ("ansible_python_interpreter", "{a: 1}", "must be text, not a mapping"),
])
def test_each_own_variable_is_checked_by_its_kind(tmp_path: Path, variable: str, value: str,
                                                  said: str) -> None:
    inv = write(tmp_path, "h.yml", f"all:\n  vars:\n    {variable}: {value}\n"
                "  children:\n    train_nodes:\n      hosts:\n        n0:\n")
    with pytest.raises(InventoryError) as err:
        load_cluster(inv)
    assert f"{variable} in {inv}: {said}" in str(err.value), str(err.value)


def test_ini_values_are_read_as_ansible_reads_them(tmp_path: Path) -> None:
    inv = write(tmp_path, "h.ini", "[train_nodes]\nn0 ansible_host=10.0.0.1\n[all:vars]\n"
                "nfs_client_kernel_mount=no\ncluster_shared_fstypes=nfs4\n"
                "cluster_rendezvous_port='30000'\ncluster_scheduler=slurm\n")
    cluster = load_cluster(inv)
    assert cluster.variables["nfs_client_kernel_mount"] is False
    assert cluster.variables["cluster_shared_fstypes"] == ["nfs4"]
    assert cluster.rendezvous_port == 30000 and cluster.scheduler == "slurm"


def test_an_ini_host_defined_twice_with_two_addresses_is_refused(tmp_path: Path) -> None:
    inv = write(tmp_path, "h.ini", "[train_nodes]\nnode1 ansible_host=10.0.0.1\n"
                "node2 ansible_host=10.0.0.3\n\n[gpu]\nnode1 ansible_host=10.0.0.2\n")
    with pytest.raises(InventoryError, match=r"node1 is defined twice in .*h.ini with two "
                       r"addresses: line 2 says ansible_host=10.0.0.1, line 6 says "
                       r"ansible_host=10.0.0.2 .*Ansible keeps the last"):
        load_cluster(inv)


def test_a_yaml_host_given_two_addresses_by_two_groups_is_refused(tmp_path: Path) -> None:
    inv = write(tmp_path, "h.yml", "all:\n  children:\n    train_nodes:\n      hosts:\n"
                "        node1: {ansible_host: 10.0.0.1}\n        node2: {ansible_host: 10.0.0.3}\n"
                "    gpu:\n      hosts:\n        node1:\n          ansible_host: 10.0.0.2\n")
    with pytest.raises(InventoryError, match=r"node1 is defined twice in .*h.yml with two "
                       r"addresses: group all > train_nodes says ansible_host=10.0.0.1, group "
                       r"all > gpu says ansible_host=10.0.0.2 \(Ansible keeps one\)"):
        load_cluster(inv)
    same = write(tmp_path, "same.yml", "all:\n  children:\n    train_nodes:\n      hosts:\n"
                 "        node1: {ansible_host: 10.0.0.1}\n    gpu:\n      hosts:\n"
                 "        node1:\n")   # the same machine, named again: fine
    assert [n.name for n in load_cluster(same).nodes] == ["node1"]


def test_an_ini_host_in_two_groups_with_one_address_is_taken(tmp_path: Path) -> None:
    inv = write(tmp_path, "h.ini", "[train_nodes]\nnode1 ansible_host=10.0.0.1\n"
                "[gpu]\nnode1\n[a100]\nnode1 ansible_host=10.0.0.1 gpus=8\n"
                "[gpu:vars]\nansible_host=10.0.0.9\n")
    assert load_cluster(inv).nodes[0].host == "10.0.0.1"
