"""The collection clustertrain.cluster as ansible-galaxy builds and installs it: what it
carries, and its module, module_utils and filters used by FQCN from a playbook outside the
repository (on this machine, connection local; test_collection_sandbox.py runs its roles
on the sandbox cluster)."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

INVENTORY = """\
all:
  hosts:
    localhost: {ansible_connection: local}
  children:
    members:
      hosts:
        n1: {ansible_host: 192.0.2.1, cluster_address: 10.0.0.1}
        n2: {ansible_host: "2001:db8::2", cluster_address: "  "}
        n3: {ansible_host: "[2001:db8::3]"}
"""

# The member-address rule through the collection's filter, and the resolver module (its
# IP rule from the collection's module_utils, shipped to the "node") on its output.
PLAYBOOK = """\
- name: The collection's filters and module, by FQCN
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Each member's address
      ansible.builtin.set_fact:
        addresses: "{{ dict(groups.members | zip(groups.members
                       | map('clustertrain.cluster.common_member_address', hostvars))) }}"
    - name: Resolve them on the node
      clustertrain.cluster.cluster_addresses:
        members: "{{ groups.members | clustertrain.cluster.common_member_addresses(hostvars) }}"
      register: resolved
    - name: Report
      ansible.builtin.debug:
        msg: "RESULT={{ {'filter': addresses, 'module': resolved.addresses} | to_json }}"
"""


def test_the_tarball_carries_the_roles_and_the_plugins_as_files(installed_collection):
    with tarfile.open(installed_collection.tarball) as tar:
        members = {m.name: m for m in tar.getmembers()}
    for path in ("roles/common/tasks/main.yml", "roles/firewall/templates/clustertrain.nft.j2",
                 "plugins/filter/cluster_members.py", "plugins/filter/firewall_net.py",
                 "plugins/filter/nfs_server_filters.py", "plugins/modules/cluster_addresses.py",
                 "plugins/module_utils/cluster_contract.py", "environment.yml"):
        assert path in members and members[path].isfile(), path
    assert not [n for n in members if n.startswith(("orchestrator/", "tests/", "playbooks/"))]


def test_a_playbook_outside_the_repository_uses_the_filters_and_module_by_fqcn(
        installed_collection, tmp_path):
    (tmp_path / "hosts.yml").write_text(INVENTORY)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    proc = installed_collection.ansible(
        "ansible-playbook", "-i", "hosts.yml", "-e", f"ansible_python_interpreter={sys.executable}",
        "play.yml", cwd=tmp_path, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    line, = [x for x in proc.stdout.splitlines() if "RESULT=" in x]
    result = json.loads(line.split("RESULT=", 1)[1].rstrip('"').replace('\\"', '"'))
    assert result["filter"] == {"n1": "10.0.0.1", "n2": "2001:db8::2", "n3": "[2001:db8::3]"}
    assert result["module"] == {"n1": "10.0.0.1", "n2": "2001:db8::2", "n3": "2001:db8::3"}
    # Nothing came from the checkout: the plugins ran from the installed collection.
    assert str(Path(__file__).resolve().parents[2]) not in out
