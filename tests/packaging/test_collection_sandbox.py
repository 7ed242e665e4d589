"""The roles as the collection clustertrain.cluster (built and installed by ansible-galaxy,
see conftest.installed_collection), used by FQCN from a playbook of one's own in a
directory outside the repository (no roles_path or collections path into it): on the
shared cluster that site.yml provisioned, they put back exactly what drifted on one node
and change nothing on the others (the roles as a collection converge to what site.yml made)."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from ..cluster import play_recap

pytestmark = pytest.mark.sandbox

RULES_FILE = "/etc/nftables.d/clustertrain.nft"   # roles/firewall/defaults: firewall_rules_file
DRIFT = "# drift: changed by hand"

PLAYBOOK = """\
- name: Base system, from the collection
  hosts: cluster
  become: true
  roles:
    - role: clustertrain.cluster.common

- name: Firewall (its filters, and common's module through include_role), from the collection
  hosts: cluster
  become: true
  roles:
    - role: clustertrain.cluster.firewall

- name: The collection's filter in a play of one's own
  hosts: cluster
  gather_facts: false
  tasks:
    - name: Every member's address is the one the inventory gives
      ansible.builtin.assert:
        that: (inventory_hostname | clustertrain.cluster.common_member_address(hostvars))
              == expected_addresses[inventory_hostname]
"""


def test_a_playbook_of_ones_own_converges_the_cluster_with_the_collections_roles(
        sandbox_cluster, installed_collection, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "ansible.cfg").write_text(textwrap.dedent("""\
        [defaults]
        interpreter_python = auto_silent
        [ssh_connection]
        pipelining = true
        """))
    (site / "playbook.yml").write_text(PLAYBOOK)
    # What the inventory gives each member as its cluster_address.
    inventory = yaml.safe_load(sandbox_cluster.inventory.read_text())
    members = inventory["all"]["children"]["cluster"]["children"]["train_nodes"]["hosts"]
    expected = json.dumps({"expected_addresses": {
        name: members[name]["cluster_address"] for name in sandbox_cluster.nodes}})

    # One node's ruleset edited by hand (it is not loaded: nothing changes on the network).
    first = sorted(sandbox_cluster.nodes)[0]
    provisioned = sandbox_cluster.exec(first, "cat", RULES_FILE).stdout
    sandbox_cluster.exec(first, "sh", "-c", f"echo '{DRIFT}' >> {RULES_FILE}")

    proc = installed_collection.ansible(
        "ansible-playbook", "-i", str(sandbox_cluster.inventory), "-e", expected,
        "playbook.yml", cwd=site, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    converge = play_recap(proc.stdout)
    assert set(converge) == set(sandbox_cluster.nodes), proc.stdout[-3000:]
    assert all(c["failed"] == 0 and c["unreachable"] == 0 for c in converge.values()), converge
    assert converge[first]["changed"] > 0, converge
    assert sandbox_cluster.exec(first, "cat", RULES_FILE).stdout == provisioned
    assert all(c["changed"] == 0 for node, c in converge.items() if node != first), converge
