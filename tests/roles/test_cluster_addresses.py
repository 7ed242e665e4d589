"""Cluster addresses may be DNS names: the common role's resolver (module
`cluster_addresses`, run on the nodes) and its controller-side filters.

Pure unit tests: the resolver is given a fake getaddrinfo, so no name is looked up here.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from .sources import REPO, load

# The module imports the collection's module_utils as Ansible ships it to a node.
contract = load("plugins/module_utils/cluster_contract.py", "cluster_contract")
sys.modules.setdefault(
    "ansible_collections.clustertrain.cluster.plugins.module_utils.cluster_contract", contract)
resolver = load("plugins/modules/cluster_addresses.py", "cluster_addresses")
members_filters = load("plugins/filter/cluster_members.py", "cluster_members")


def fake_getaddrinfo(table: dict[str, list[str]]):
    """A getaddrinfo that answers from `table` and records what it was asked."""
    asked: list[str] = []

    def getaddrinfo(name, port, family=0, type=0, *args):
        asked.append(name)
        if name not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        out = []
        for ip in table[name]:
            fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
            sockaddr = (ip, 0, 0, 0) if fam == socket.AF_INET6 else (ip, 0)
            out.append((fam, socket.SOCK_STREAM, 6, "", sockaddr))
        return out

    getaddrinfo.asked = asked  # type: ignore[attr-defined]  # read by the tests
    return getaddrinfo


def member(host, address, variable="cluster_address"):
    return {"host": host, "address": address, "variable": variable}


def test_ip_addresses_are_kept_unchanged_without_a_lookup():
    lookup = fake_getaddrinfo({})
    addresses, details, errors = resolver.resolve_members(
        [member("n0", "10.10.0.11"), member("n1", "2001:db8::12"), member("n2", "[2001:db8::13]")],
        getaddrinfo=lookup)
    assert errors == []
    assert addresses == {"n0": "10.10.0.11", "n1": "2001:db8::12", "n2": "2001:db8::13"}
    assert lookup.asked == []
    assert details["n0"]["resolved"] is False


def test_a_dns_name_resolves_to_its_ipv4_address_first():
    lookup = fake_getaddrinfo({"node1": ["2001:db8::11", "10.89.0.11", "10.89.0.99"],
                               "gpu02.ib.example": ["10.10.0.12"]})
    addresses, details, errors = resolver.resolve_members(
        [member("node1", "node1"), member("gpu02", "gpu02.ib.example", "ansible_host")],
        getaddrinfo=lookup)
    assert errors == []
    assert addresses == {"node1": "10.89.0.11", "gpu02": "10.10.0.12"}
    assert details["node1"]["all"] == ["2001:db8::11", "10.89.0.11", "10.89.0.99"]
    assert details["node1"]["resolved"] is True


def test_link_local_ipv6_answers_are_not_used():
    addresses, _, errors = resolver.resolve_members(
        [member("n0", "n0")], getaddrinfo=fake_getaddrinfo({"n0": ["fe80::1", "2001:db8::7"]}))
    assert errors == [] and addresses == {"n0": "2001:db8::7"}


def test_a_name_with_only_an_ipv6_address_gets_it():
    addresses, _, errors = resolver.resolve_members(
        [member("n0", "v6only")], getaddrinfo=fake_getaddrinfo({"v6only": ["2001:db8::5"]}))
    assert errors == [] and addresses == {"n0": "2001:db8::5"}


@pytest.mark.parametrize(("variable", "hint"), [
    ("cluster_address", "n1: cluster_address 'gpu01.typo.example' does not resolve"),
    ("ansible_host",
     "n1: ansible_host 'gpu01.typo.example' (cluster_address is not set) does not resolve"),
    ("inventory_hostname", "neither cluster_address nor ansible_host is set"),
])
def test_a_name_that_does_not_resolve_is_an_error_naming_host_and_variable(variable, hint):
    addresses, _, errors = resolver.resolve_members(
        [member("n0", "10.0.0.1"), member("n1", "gpu01.typo.example", variable)],
        getaddrinfo=fake_getaddrinfo({}))
    assert addresses == {"n0": "10.0.0.1"}
    assert len(errors) == 1 and hint in errors[0], errors
    message = resolver.failure_message(errors, "node0")
    assert "on node0" in message and "cluster_address" in message
    assert "Name or service not known" in message


def test_loopback_answers_are_never_used_dns_is_asked_instead():
    """Debian's '127.0.1.1 <hostname>' line makes a node's own name resolve to loopback."""
    lookup = fake_getaddrinfo({"gpu01": ["127.0.1.1"]})
    addresses, _, errors = resolver.resolve_members(
        [member("gpu01", "gpu01")], getaddrinfo=lookup, dns_only=lambda name: ["10.10.0.11"])
    assert errors == [] and addresses == {"gpu01": "10.10.0.11"}

    addresses, _, errors = resolver.resolve_members(
        [member("gpu01", "gpu01")], getaddrinfo=lookup, dns_only=lambda name: [])
    assert addresses == {}
    assert "gpu01: cluster_address 'gpu01' resolves only to 127.0.1.1" in errors[0]


def test_an_empty_address_is_an_error():
    _, _, errors = resolver.resolve_members([member("n0", "  ")], getaddrinfo=fake_getaddrinfo({}))
    assert errors == ["n0: cluster_address '' is empty"]


# --- controller-side filters -----------------------------------------------------------

HOSTVARS = {
    "gpu01": {"ansible_host": "192.0.2.11", "cluster_address": "10.10.0.11",
              "ansible_facts": {"hostname": "gpu01"}},
    "gpu02": {"ansible_host": "192.0.2.12", "cluster_address": "",
              "ansible_facts": {"hostname": "gpu-02"}},
    "node1": {"cluster_address": "node1", "ansible_facts": {"hostname": "sbx-node1"}},
    "node2": {"ansible_facts": {}},
}


def test_member_addresses_take_cluster_address_then_ansible_host_then_the_name():
    assert members_filters.common_member_addresses(list(HOSTVARS), HOSTVARS) == [
        {"host": "gpu01", "address": "10.10.0.11", "variable": "cluster_address"},
        {"host": "gpu02", "address": "192.0.2.12", "variable": "ansible_host"},
        {"host": "node1", "address": "node1", "variable": "cluster_address"},
        {"host": "node2", "address": "node2", "variable": "inventory_hostname"},
    ]


@pytest.mark.parametrize("connection,over_ssh", [
    (None, True), ("", True), ("ssh", True), ("smart", True), ("paramiko", True),
    ("ansible.builtin.paramiko_ssh", True), ("local", False),
    ("community.docker.docker", False), ("winrm", False)])
def test_the_connections_that_log_in_over_ssh(connection, over_ssh):
    """The firewall keeps the controller's SSH open for these (and the common role refuses
    to turn password logins off under a password login over them)."""
    assert members_filters.common_over_ssh(connection) is over_ssh


def test_only_hosts_not_resolved_yet_are_looked_up_again():
    assert members_filters.common_unresolved(["a", "b", "a", "c"], {"b": "10.0.0.2"}) == ["a", "c"]
    assert members_filters.common_unresolved(["a"], None) == ["a"]


def test_hosts_lines_for_an_inventory_of_ips_are_as_before():
    lines = members_filters.common_hosts_lines(
        ["gpu01", "gpu02"], HOSTVARS, {"gpu01": "10.10.0.11", "gpu02": "192.0.2.12"})
    assert lines == ["10.10.0.11 gpu01", "192.0.2.12 gpu02 gpu-02"]


def test_hosts_lines_hold_ips_and_leave_dns_names_to_dns():
    """A name that is a member's cluster address is not pinned in /etc/hosts (DNS has it, and
    the next run's resolution would read the pinned IP back)."""
    lines = members_filters.common_hosts_lines(
        ["gpu01", "node1", "node2"], HOSTVARS,
        {"gpu01": "10.10.0.11", "node1": "10.89.0.11", "node2": "10.89.0.12"})
    # node1's host name is written, its DNS name is not; node2 has nothing but its DNS name.
    assert lines == ["10.10.0.11 gpu01", "10.89.0.11 sbx-node1"]


# --- the real roles, through ansible-playbook (IP addresses only: nothing is looked up) ----

INVENTORY = """\
[cluster]
localhost ansible_connection=local cluster_address=10.10.0.10
gpu01 cluster_address=10.10.0.11
gpu02 ansible_host=192.0.2.12
gpu03 cluster_address=2001:db8::13 ansible_host=192.0.2.13
"""

PLAYBOOK = """\
- name: Resolve the members' addresses with the common role, as other roles do
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Resolve
      ansible.builtin.include_role:
        name: common
        tasks_from: addresses
      vars:
        common_resolve_hosts: "{{ groups['cluster'] }}"
    - name: Resolve again (nothing is left to look up)
      ansible.builtin.include_role:
        name: common
        tasks_from: addresses
      vars:
        common_resolve_hosts: "{{ groups['cluster'] }}"
    - name: Show
      ansible.builtin.debug:
        msg: "IPS={{ common_cluster_ips | to_json }}"
"""


@pytest.mark.slow
def test_the_roles_resolve_an_inventory_of_ips_unchanged(tmp_path):
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "hosts.ini").write_text(INVENTORY)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_ROLES_PATH=str(REPO / "roles"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "hosts.ini"),
         "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "play.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    line = next(li for li in out.splitlines() if "IPS=" in li)
    ips = json.loads(line.split("IPS=", 1)[1].rstrip('"').replace('\\"', '"'))
    assert ips == {"localhost": "10.10.0.10", "gpu01": "10.10.0.11", "gpu02": "192.0.2.12",
                   "gpu03": "2001:db8::13"}
    # the second round found every host resolved already and skipped the module
    assert out.count("TASK [common : Resolve the cluster members' addresses on this node]") == 2
    assert "skipping: [localhost]" in out, out
