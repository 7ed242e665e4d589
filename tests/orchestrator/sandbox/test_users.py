"""A sandbox's extra researchers (`sandbox up --users carol,dave`, the soak's cast): each a
login user without sudo with an inventory and ssh_config of its own, as bob has; the
default sandbox unchanged. No podman needed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.errors import SandboxError
from orchestrator.sandbox.cluster import add_users_script
from orchestrator.sandbox.layout import (
    USERS,
    SandboxSpec,
    describe,
    render_inventory,
    render_ssh_config,
)


def spec(tmp_path: Path, users: tuple[str, ...] = ()) -> SandboxSpec:
    return SandboxSpec(name="soak1", nodes=4, bastion=True, subnet="10.89.3.0/24",
                       state_dir=tmp_path / "soak1", slurm=True, extra_users=users)


def test_the_default_sandbox_has_alice_and_bob_only(tmp_path: Path) -> None:
    s = spec(tmp_path)
    assert s.users == USERS
    assert add_users_script(s) == "set -eu\n"
    assert list(describe(s)["users"]) == ["alice", "bob"]


def test_extra_researchers_log_in_as_themselves_without_sudo(tmp_path: Path) -> None:
    s = spec(tmp_path, ("carol", "dave"))
    assert [(u.name, u.uid, u.sudo) for u in s.users] == [
        ("alice", 1001, True), ("bob", 1002, False), ("carol", 1003, False),
        ("dave", 1004, False)]
    inventory = yaml.safe_load(render_inventory(s, user="carol"))["all"]["vars"]
    assert inventory["ansible_user"] == "carol" and inventory["ansible_become"] is False
    assert inventory["ansible_ssh_common_args"] == f"-F {s.ssh_config_for('carol')}"
    assert inventory["ansible_control_path_dir"].endswith("cp-carol")
    # Every user of the sandbox is a user of the cluster (site.yml: their share directories,
    # their Slurm accounts), whoever's inventory it is.
    assert yaml.safe_load(render_inventory(s))["all"]["vars"]["cluster_users"] == [
        "alice", "bob", "carol", "dave"]
    config = render_ssh_config(s, "dave")
    assert "    User dave" in config and "ProxyJump bastion" in config
    info = describe(s)["users"]
    assert info["dave"] == {"inventory": str(s.inventory_for("dave")),
                            "ssh_config": str(s.ssh_config_for("dave")), "uid": 1004,
                            "sudo": False}
    script = add_users_script(s)
    assert "useradd -u 1003 -g 1003 -m -s /bin/bash -p '*' carol" in script
    assert "install -m 0600 -o 1004 -g 1004 /run/sandbox-key.pub /home/dave/.ssh/" \
           "authorized_keys" in script
    assert "sudo" not in script   # researchers, not admins


@pytest.mark.parametrize(("users", "said"), [
    (("bob",), "bob is already a login user"),
    (("Carol",), "'Carol' is not a user name"),
    (("carol", "carol"), "a user is named twice"),
    (("root;rm",), "is not a user name")])
def test_a_wrong_user_list_is_refused_naming_what_is_wrong(tmp_path: Path, users: tuple[str, ...],
                                                          said: str) -> None:
    with pytest.raises(SandboxError, match=said):
        spec(tmp_path, users)


def test_an_unknown_user_is_named_with_how_to_add_one(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="sandbox up --users"):
        render_inventory(spec(tmp_path), user="carol")
