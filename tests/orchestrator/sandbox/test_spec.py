"""The sandbox's inventory writer and its input checks (no podman needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.vars.manager import VariableManager

from orchestrator.errors import SandboxError
from orchestrator.sandbox.image import ImageRecipe, host_mirror
from orchestrator.sandbox.spec import SandboxSpec, render_inventory, sandbox_vars


def spec(tmp_path: Path, nodes: int = 3, outsiders: int = 1) -> SandboxSpec:
    return SandboxSpec(name="demo", nodes=nodes, outsiders=outsiders,
                       subnet="10.89.3.0/24", state_dir=tmp_path / "demo")


def load_inventory(tmp_path: Path, text: str):
    path = tmp_path / "inventory.yml"
    path.write_text(text)
    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(path)])
    return inv, VariableManager(loader=loader, inventory=inv)


def test_inventory_is_read_by_ansible_with_groups_addresses_and_key(tmp_path):
    s = spec(tmp_path)
    inv, variables = load_inventory(tmp_path, render_inventory(s, {"nfs_server_implementation": "ganesha"}))

    assert [h.name for h in inv.groups["train_nodes"].get_hosts()] == ["node0", "node1", "node2"]
    assert inv.groups["nfs_server"].get_hosts()[0].name == "node0"
    assert [h.name for h in inv.groups["outsiders"].get_hosts()] == ["outsider0"]
    assert "outsider0" not in [h.name for h in inv.groups["cluster"].get_hosts()]

    node1 = variables.get_vars(host=inv.get_host("node1"))
    assert node1["ansible_host"] == "10.89.3.11"
    assert node1["cluster_address"] == "10.89.3.11"
    assert node1["ansible_user"] == "root"
    assert node1["ansible_ssh_private_key_file"] == str(s.key_path)
    assert f"UserKnownHostsFile={s.known_hosts}" in node1["ansible_ssh_common_args"]
    assert "StrictHostKeyChecking=yes" in node1["ansible_ssh_common_args"]
    assert node1["nfs_server_implementation"] == "ganesha"
    assert variables.get_vars(host=inv.get_host("outsider0"))["ansible_host"] == "10.89.3.13"


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


def test_host_mirror_reads_deb822_and_one_line_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n")
    assert host_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://other.example/debian/ bookworm main\n")
    assert host_mirror(tmp_path) == "http://other.example/debian"


def test_image_tag_depends_on_the_recipe_not_the_mirror():
    a = ImageRecipe(mirror="http://a.example/debian")
    b = ImageRecipe(mirror="http://b.example/debian")
    c = ImageRecipe(mirror="http://a.example/debian", packages=a.packages + ("vim",))
    assert a.tag == b.tag
    assert a.tag != c.tag
    assert a.security_mirror == "http://a.example/debian-security"
