"""Bad firewall variables fail at the very start, naming the variable.

Runs the real role with ansible-playbook against localhost (connection=local,
check mode): validation is the first thing the role does, so nothing is touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Runs ansible-playbook or pip for real: seconds to a minute each.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = """\
- name: Firewall role with the variables under test
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: firewall
"""
# A task name from after validation: seeing it would mean validation let bad input through.
AFTER_VALIDATION = "Install nftables"  # prefix of the install tasks


def run_role(tmp_path: Path, extra_vars: dict, *args: str) -> subprocess.CompletedProcess:
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK)
    env = dict(os.environ,
               ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_ROLES_PATH=str(REPO / "roles"),
               ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="false",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
           "--check", "-e", json.dumps(extra_vars), *args, str(playbook)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("extra_vars", "expected"), [
    ({"firewall_admin_networks": ["10.0.0.0/33"]},
     ["firewall_admin_networks", "10.0.0.0/33"]),
    ({"firewall_admin_networks": ["192.0.2.0/24", "admin-laptop"]},
     ["firewall_admin_networks", "admin-laptop"]),
    ({"cluster_admin_networks": ["300.1.2.3"]},
     ["firewall_admin_networks", "300.1.2.3"]),
    ({"firewall_admin_networks": "192.0.2.0/24 198.51.100.0/24"},
     ["firewall_admin_networks"]),
    ({"firewall_ssh_port": "ssh"}, ["firewall_ssh_port"]),
    ({"firewall_rendezvous_port": 70000}, ["firewall_rendezvous_port", "70000"]),
    ({"firewall_cluster_tcp_ports": [22, 0]}, ["firewall_cluster_tcp_ports", "port 0"]),
    ({"firewall_extra_rules": [{"protocol": "tcp"}]}, ["firewall_extra_rules", "port"]),
    ({"firewall_extra_rules": [{"port": 8080, "protocol": "sctp"}]}, ["protocol", "sctp"]),
    ({"firewall_extra_rules": [{"port": 8080, "sources": ["198.51.100.0/40"]}]},
     ["firewall_extra_rules", "198.51.100.0/40"]),
])
def test_bad_variable_fails_before_anything_runs(tmp_path, extra_vars, expected):
    proc = run_role(tmp_path, extra_vars)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    for text in expected:
        assert text in out, f"{text!r} missing from the failure:\n{out}"
    assert AFTER_VALIDATION not in out, out


def test_good_variables_pass_validation(tmp_path):
    """The control case: the same checks accept well-formed input."""
    proc = run_role(tmp_path, {
        "cluster_admin_networks": ["192.0.2.0/24", "2001:db8::/32", "198.51.100.7"],
        "firewall_rendezvous_port": 29400,
        "firewall_extra_rules": [{"port": 9100, "protocol": "tcp",
                                  "sources": ["203.0.113.0/24"], "comment": "metrics"}],
    }, "--tags", "firewall_validate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok=" in proc.stdout and "failed=0" in proc.stdout
