"""The sandbox's inventory and ssh_config writers and its input checks (no podman needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.vars.manager import VariableManager

from orchestrator.errors import SandboxError
from orchestrator.sandbox.image import ImageRecipe, host_mirror
from orchestrator.sandbox.layout import (
    SandboxSpec,
    describe,
    render_inventory,
    render_ssh_config,
    sandbox_vars,
)


def spec(tmp_path: Path, nodes: int = 3, outsiders: int = 1, bastion: bool = False) -> SandboxSpec:
    return SandboxSpec(name="demo", nodes=nodes, outsiders=outsiders, bastion=bastion,
                       subnet="10.89.3.0/24", state_dir=tmp_path / "demo")


def load_inventory(tmp_path: Path, text: str):
    path = tmp_path / "inventory.yml"
    path.write_text(text)
    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(path)])
    return inv, VariableManager(loader=loader, inventory=inv)


def test_inventory_is_read_by_ansible_with_groups_names_and_login(tmp_path):
    s = spec(tmp_path)
    inv, variables = load_inventory(
        tmp_path, render_inventory(s, {"nfs_server_implementation": "ganesha"}))

    assert [h.name for h in inv.groups["train_nodes"].get_hosts()] == ["node0", "node1", "node2"]
    assert inv.groups["nfs_server"].get_hosts()[0].name == "node0"
    assert [h.name for h in inv.groups["outsiders"].get_hosts()] == ["outsider0"]
    assert "outsider0" not in [h.name for h in inv.groups["cluster"].get_hosts()]

    node1 = variables.get_vars(host=inv.get_host("node1"))
    # Reached by name through the ssh_config, as a user with sudo; no address in the inventory.
    assert "ansible_host" not in node1
    assert "ansible_ssh_private_key_file" not in node1
    assert node1["cluster_address"] == "node1"
    assert node1["ansible_user"] == "alice"
    assert node1["ansible_become"] is True
    assert node1["ansible_ssh_common_args"] == f"-F {s.ssh_config}"
    assert node1["cluster_admin_networks"] == ["10.89.3.1/32"]  # the host, as the nodes see it
    assert node1["nfs_server_implementation"] == "ganesha"
    assert "ansible_host" not in variables.get_vars(host=inv.get_host("outsider0"))


def test_inventory_of_the_user_without_sudo(tmp_path):
    s = spec(tmp_path)
    assert s.inventory_for("bob") == s.state_dir / "inventory-bob.yml"
    inv, variables = load_inventory(tmp_path, render_inventory(s, user="bob"))
    node0 = variables.get_vars(host=inv.get_host("node0"))
    assert node0["ansible_user"] == "bob"
    assert node0["ansible_become"] is False
    assert node0["ansible_ssh_common_args"] == f"-F {s.state_dir / 'ssh_config-bob'}"


def test_sandbox_group_vars_cannot_change_the_login(tmp_path):
    s = spec(tmp_path)
    inv, variables = load_inventory(tmp_path, render_inventory(
        s, {"ansible_user": "root", "ansible_become": False, "cluster_admin_networks": []}))
    node0 = variables.get_vars(host=inv.get_host("node0"))
    assert (node0["ansible_user"], node0["ansible_become"]) == ("alice", True)
    assert node0["cluster_admin_networks"] == ["10.89.3.1/32"]


def test_unknown_user_is_refused(tmp_path):
    with pytest.raises(SandboxError, match="no login user 'root'"):
        render_inventory(spec(tmp_path), user="root")


def ssh_effective(config: str, tmp_path: Path, host: str) -> dict[str, str]:
    """What OpenSSH itself makes of the ssh_config for HOST (`ssh -G`: parses, never connects)."""
    path = tmp_path / "ssh_config-under-test"
    path.write_text(config)
    out = subprocess.run([shutil.which("ssh") or "ssh", "-G", "-F", str(path), host],
                         capture_output=True, text=True, check=True).stdout
    return {k: v for k, _, v in (line.partition(" ") for line in out.splitlines())}


def test_ssh_config_reaches_each_container_by_name_as_the_user(tmp_path):
    s = spec(tmp_path)
    config = render_ssh_config(s)
    for name, address in [("node0", "10.89.3.10"), ("node2", "10.89.3.12"),
                          ("outsider0", "10.89.3.13")]:
        opts = ssh_effective(config, tmp_path, name)
        assert opts["hostname"] == address
        assert opts["user"] == "alice"
        assert opts["identityfile"] == str(s.key_path)
        assert opts["identitiesonly"] == "yes"
        assert opts["userknownhostsfile"] == str(s.known_hosts)
        assert opts["stricthostkeychecking"] == "true"
        assert opts.get("proxyjump", "none") == "none"
    assert ssh_effective(render_ssh_config(s, "bob"), tmp_path, "node1")["user"] == "bob"
    assert "Host bastion" not in config


def test_ssh_config_with_bastion_jumps_through_it(tmp_path):
    s = spec(tmp_path, nodes=2, outsiders=1, bastion=True)
    config = render_ssh_config(s, "bob")
    bastion = ssh_effective(config, tmp_path, "bastion")
    assert bastion["hostname"] == "10.89.3.13"  # after the nodes and outsiders
    assert bastion["user"] == "bob"
    assert bastion.get("proxyjump", "none") == "none"
    for name in ("node0", "node1", "outsider0"):
        assert ssh_effective(config, tmp_path, name)["proxyjump"] == "bastion"


def test_bastion_is_a_container_but_not_an_inventory_host(tmp_path):
    s = spec(tmp_path, nodes=2, outsiders=1, bastion=True)
    assert [n.name for n in s.members()] == ["node0", "node1", "outsider0"]
    assert [n.name for n in s.containers()] == ["node0", "node1", "outsider0", "bastion"]
    inv, variables = load_inventory(tmp_path, render_inventory(s))
    assert "bastion" not in [h.name for h in inv.get_hosts()]
    # SSH reaches the nodes from the host and from the bastion: both stay admin networks.
    assert variables.get_vars(host=inv.get_host("node0"))["cluster_admin_networks"] == \
        ["10.89.3.1/32", "10.89.3.13/32"]


def test_status_names_users_ssh_config_and_bastion(tmp_path):
    s = spec(tmp_path, nodes=1, outsiders=0, bastion=True)
    info = describe(s, {"demo-node0": "running", "demo-bastion": "running"})
    assert info["inventory"] == str(s.state_dir / "inventory.yml")
    assert info["ssh_config"] == str(s.state_dir / "ssh_config")
    assert info["gateway"] == "10.89.3.1"
    assert info["users"] == {
        "alice": {"inventory": str(s.state_dir / "inventory.yml"),
                  "ssh_config": str(s.state_dir / "ssh_config"), "uid": 1001, "sudo": True},
        "bob": {"inventory": str(s.state_dir / "inventory-bob.yml"),
                "ssh_config": str(s.state_dir / "ssh_config-bob"), "uid": 1002, "sudo": False}}
    assert info["bastion"] == {"name": "bastion", "address": "10.89.3.11",
                               "container": "demo-bastion", "state": "running"}
    assert info["nodes"] == [{"name": "node0", "container": "demo-node0", "address": "10.89.3.10",
                              "outsider": False, "state": "running"}]
    assert describe(spec(tmp_path))["bastion"] is None


def test_gateway_is_podmans_when_named(tmp_path):
    s = SandboxSpec(name="demo", nodes=1, subnet="10.89.3.0/24", gateway="10.89.3.254",
                    state_dir=tmp_path)
    assert s.admin_networks() == ["10.89.3.254/32"]


def test_inventory_without_outsiders_is_valid(tmp_path):
    inv, _ = load_inventory(tmp_path, render_inventory(spec(tmp_path, nodes=1, outsiders=0)))
    assert [h.name for h in inv.groups["train_nodes"].get_hosts()] == ["node0"]
    assert inv.groups["outsiders"].get_hosts() == []


def test_sandbox_group_vars_file_is_a_mapping():
    assert isinstance(sandbox_vars(), dict)


def test_sandbox_group_vars_rejects_a_list(tmp_path):
    bad = tmp_path / "all.yml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(SandboxError, match="mapping"):
        sandbox_vars(bad)


@pytest.mark.parametrize("name", ["Demo", "1abc", "a_b", "", "x" * 31, "demo/../x"])
def test_bad_names_are_refused_with_the_rule(name, tmp_path):
    with pytest.raises(SandboxError, match="lowercase letters"):
        SandboxSpec(name=name, nodes=2, state_dir=tmp_path)


@pytest.mark.parametrize("nodes,outsiders,msg", [(0, 0, "1 to 64 nodes"), (65, 0, "1 to 64 nodes"),
                                                 (2, 9, "0 to 8 outsiders")])
def test_node_counts_are_bounded(nodes, outsiders, msg, tmp_path):
    with pytest.raises(SandboxError, match=msg):
        SandboxSpec(name="demo", nodes=nodes, outsiders=outsiders, state_dir=tmp_path)


def test_subnet_too_small_is_reported(tmp_path):
    s = SandboxSpec(name="demo", nodes=10, subnet="10.89.3.0/28", state_dir=tmp_path)
    with pytest.raises(SandboxError, match="too small"):
        s.members()
    # 5 nodes fit a /28 (.10-.14), the bastion would be its broadcast address .15
    s = SandboxSpec(name="demo", nodes=5, subnet="10.89.3.0/28", state_dir=tmp_path, bastion=True)
    with pytest.raises(SandboxError, match="too small for 6 containers"):
        s.containers()


def test_host_mirror_reads_deb822_and_one_line_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n")
    assert host_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text(
        "deb [arch=amd64] http://other.example/debian/ bookworm main\n")
    assert host_mirror(tmp_path) == "http://other.example/debian"


def test_image_tag_depends_on_the_recipe_not_the_mirror():
    a = ImageRecipe(mirror="http://a.example/debian")
    b = ImageRecipe(mirror="http://b.example/debian")
    c = ImageRecipe(mirror="http://a.example/debian", packages=a.packages + ("vim",))
    assert "nftables" in a.packages  # the bastion's rule lives in each node's own netns
    assert a.tag == b.tag
    assert a.tag != c.tag
    assert a.security_mirror == "http://a.example/debian-security"
