"""The node contract's rules exist once (plugins/module_utils/cluster_contract.py) and
every part that applies them gives the same answer for the same inventory: the common
role's filters and vars, the orchestrator's inventory reader and preflight.

A member's address is its cluster_address, else its ansible_host, else its inventory name;
an empty (or blank) cluster_address counts as not set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from orchestrator import contract as orchestrator_contract
from orchestrator.cluster.inventory import load_cluster

from .sources import REPO, load

rules = load("plugins/module_utils/cluster_contract.py", "cluster_contract")
filters = load("plugins/filter/cluster_members.py", "cluster_members")

# (inventory name, its variables in YAML, the address every part must give)
CASES = [
    ("both", 'ansible_host: 192.0.2.1, cluster_address: 10.0.0.1', "10.0.0.1"),
    ("empty", 'ansible_host: 192.0.2.2, cluster_address: ""', "192.0.2.2"),
    ("blank", 'ansible_host: 192.0.2.3, cluster_address: "  "', "192.0.2.3"),
    ("padded", 'ansible_host: 192.0.2.4, cluster_address: " gpu4-ib.example.org "',
     "gpu4-ib.example.org"),
    ("sshonly", 'ansible_host: 192.0.2.5', "192.0.2.5"),
    ("bare", None, "bare"),
]
EXPECTED = {name: address for name, _, address in CASES}


def _inventory(tmp_path: Path, extra: str = "") -> Path:
    lines = ["all:", "  children:", "    train_nodes:", "      hosts:"]
    for name, variables, _ in CASES:
        lines.append(f"        {name}: {{{variables}}}" if variables else f"        {name}:")
    path = tmp_path / "hosts.yml"
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def _hostvars() -> dict[str, dict]:
    import yaml

    return {name: yaml.safe_load("{" + (variables or "") + "}") for name, variables, _ in CASES}


def test_the_rule_itself() -> None:
    hostvars = _hostvars()
    assert {h: rules.member_address(h, v)[0] for h, v in hostvars.items()} == EXPECTED
    assert rules.member_address("blank", hostvars["blank"]) == ("192.0.2.3", "ansible_host")
    assert rules.member_address("bare", {}) == ("bare", "inventory_hostname")


def test_the_common_role_filters_apply_the_rule() -> None:
    hostvars = _hostvars()
    assert {h: filters.common_member_address(h, hostvars) for h in hostvars} == EXPECTED
    assert {m["host"]: m["address"] for m in
            filters.common_member_addresses(list(hostvars), hostvars)} == EXPECTED


def test_the_orchestrator_reads_the_same_addresses_from_the_inventory(tmp_path: Path) -> None:
    # Before the rule was shared, a blank cluster_address gave the node the address ''.
    nodes = load_cluster(_inventory(tmp_path)).nodes
    assert {n.name: n.cluster_address for n in nodes} == EXPECTED


@pytest.mark.parametrize("text, ip", [
    ("10.0.0.1", "10.0.0.1"), (" 10.0.0.1 ", "10.0.0.1"), ("2001:db8::1", "2001:db8::1"),
    ("[2001:db8::1]", "2001:db8::1"), ("[10.0.0.1", None), ("gpu1.example.org", None),
    ("10.0.0.256", None), ("", None)])
def test_one_ip_address_rule_for_the_roles_and_the_orchestrator(text: str, ip: str | None) -> None:
    assert rules.ip_literal(text) == ip
    assert orchestrator_contract.is_ip(text) is (ip is not None)


PLAYBOOK = """\
- name: The common role's view of each member's address
  hosts: train_nodes
  gather_facts: false
  tasks:
    - name: Load the common role (its vars and filters), resolving nothing
      ansible.builtin.include_role:
        name: common
        tasks_from: addresses
        public: true
      vars:
        common_resolve_hosts: []
    - name: Show
      ansible.builtin.debug:
        msg: "ADDR={{ {inventory_hostname: common_cluster_address_name} | to_json }}"
"""


@pytest.mark.slow
def test_the_roles_give_every_host_the_same_address_as_the_orchestrator(tmp_path: Path) -> None:
    """common_cluster_address_name (role vars) through real ansible-playbook; before the rule
    was shared, a blank cluster_address stayed blank and a padded one kept its blanks."""
    inventory = _inventory(tmp_path, "  vars:\n    ansible_connection: local\n")
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_ROLES_PATH=str(REPO / "roles"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory),
         "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "play.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    seen: dict[str, str] = {}
    for line in out.splitlines():
        if "ADDR=" in line:
            seen.update(json.loads(line.split("ADDR=", 1)[1].rstrip('"').replace('\\"', '"')))
    assert seen == EXPECTED, out


# --- node paths: the orchestrator finds the roles' files where the inventory puts them ------

class LocalConnection:
    """Runs the command on this machine (HOME: the node user's home), as ssh.Connection
    runs it on a node."""

    def __init__(self, home: Path) -> None:
        self.env = dict(os.environ, HOME=str(home))

    def run(self, command: str, timeout: float = 60.0, stdin: str | None = None):
        from orchestrator.cluster.ssh import Result

        p = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True,
                           text=True, timeout=timeout, env=self.env)
        return Result(p.returncode, p.stdout, p.stderr)


def _role_default(role: str, variable: str) -> str:
    import yaml

    return yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())[variable]


def test_node_paths_come_from_the_inventory_else_the_roles_defaults(tmp_path: Path) -> None:
    from orchestrator.run.command import NodeCommand

    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "train_nodes:\n  hosts:\n"
        "    n0: {ansible_host: 192.0.2.1, python_env_state_dir: /srv/ct/state,\n"
        "         common_cluster_env_file: /srv/ct/cluster.env}\n"
        "    n1: {ansible_host: 192.0.2.2}\n")
    n0, n1 = load_cluster(inventory).nodes
    assert (n0.env_state_dir, n0.cluster_env_file) == ("/srv/ct/state", "/srv/ct/cluster.env")
    assert (n1.env_state_dir, n1.cluster_env_file) == (
        _role_default("python_env", "python_env_state_dir"),
        _role_default("common", "common_cluster_env_file"))
    command = NodeCommand(run_id="r1", node_rank=0, nnodes=1, nproc=1, master_addr="n0",
                          master_port=29500, torchrun="/v/bin/torchrun", home="/home/alice",
                          script="train.py", cluster_env=n0.cluster_env_file, node="n0",
                          nodes=("n0",), run_state="/srv/shared/runs/alice/r1")
    assert "set -a; . /srv/ct/cluster.env; set +a" in command.shell()


def test_preflight_reads_the_environment_from_the_nodes_state_dir(tmp_path: Path) -> None:
    """The probe, run for real (locally), reads python_env.json from the directory the
    inventory gives the python_env role (python_env_state_dir), not from a fixed path."""
    from orchestrator.checks.probe import probe
    from orchestrator.cluster.ssh import Connection
    from tests.orchestrator.node.test_probe_verbs import fake_environment

    prefix = fake_environment(tmp_path)   # writes tmp_path/state/python_env.json
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "train_nodes:\n  hosts:\n"
        f"    n0: {{ansible_host: 127.0.0.1, ansible_python_interpreter: '{sys.executable}',\n"
        f"         python_env_state_dir: '{tmp_path / 'state'}'}}\n")
    [node] = load_cluster(inventory).nodes
    # LocalConnection has the one method probe() calls, Connection.run.
    conn = cast(Connection, LocalConnection(tmp_path / "home"))
    facts = probe(node, conn, shared={"path": str(tmp_path), "fstypes": None}, addresses=[],
                  port=None)
    assert not facts.python_env_error, facts.python_env_error
    assert facts.python_env is not None
    assert facts.python_env["prefix"] == str(prefix)


# --- the shared site values: written once, in roles/contract ------------------------------

SHARED = ("cluster_shared_path", "cluster_nfs_export_path", "cluster_rendezvous_port",
          "cluster_rendezvous_port_span", "cluster_ring_ports")


def _role_files(role: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(role.rglob("*"))
                     if p.is_file() and p.suffix in (".yml", ".j2"))


def test_a_role_that_uses_a_shared_value_depends_on_the_contract_role() -> None:
    import yaml

    users = []
    for role in sorted((REPO / "roles").iterdir()):
        if role.name == "contract" or not any(v in _role_files(role) for v in SHARED):
            continue
        users.append(role.name)
        meta = yaml.safe_load((role / "meta" / "main.yml").read_text())
        assert {"role": "contract"} in (meta.get("dependencies") or []), role.name
    assert users == ["firewall", "health", "nfs_client", "nfs_server", "python_env", "slurm"]


def test_no_role_or_playbook_writes_a_shared_default_again() -> None:
    import re

    again = re.compile(r"(%s)\s*\|\s*default\(" % "|".join(SHARED))
    for path in [*(REPO / "roles").rglob("*.yml"), *(REPO / "playbooks").rglob("*.yml")]:
        assert not again.search(path.read_text()), path


def test_the_orchestrator_and_the_sandbox_read_the_contracts_values() -> None:
    from orchestrator import defaults
    from orchestrator.sandbox import layout as spec

    values = {name: _role_default("contract", name) for name in SHARED}
    assert defaults.SHARED_PATH == spec.SHARED_PATH == values["cluster_shared_path"]
    assert spec.EXPORT_PATH == values["cluster_nfs_export_path"]
    assert defaults.RENDEZVOUS_PORT == values["cluster_rendezvous_port"]
    assert defaults.RING_PORTS == values["cluster_ring_ports"]
