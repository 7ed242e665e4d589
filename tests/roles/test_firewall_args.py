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
    ({"firewall_slurm_ports": ["6817", "70000"]}, ["firewall_slurm_ports", "70000"]),
    ({"firewall_slurm_ports": ["60100-60001"]}, ["firewall_slurm_ports", "60100-60001"]),
    ({"cluster_scheduler": "slurm", "cluster_slurm_ports": {"srun": "6000-x"}},
     ["firewall_slurm_ports (default: cluster_slurm_ports)", "6000-x"]),
    ({"cluster_ring_ports": "29899-29700"},
     ["firewall_ring_ports (default: cluster_ring_ports)", "29899-29700", "LOW <= HIGH"]),
    ({"firewall_ring_ports": "80-90"}, ["firewall_ring_ports", "unprivileged ports"]),
    ({"firewall_ring_ports": "29700"}, ["firewall_ring_ports", "write it LOW-HIGH"]),
    ({"firewall_rendezvous_port_span": 0}, ["firewall_rendezvous_port_span", "at least 1 port"]),
    ({"cluster_rendezvous_port": 65500},
     ["firewall_rendezvous_port_span (default: cluster_rendezvous_port_span)", "65535 at most"]),
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
        "firewall_rendezvous_port_span": 100,
        "cluster_ring_ports": "1024-1100",
        "cluster_scheduler": "slurm",
        "firewall_extra_rules": [{"port": 9100, "protocol": "tcp",
                                  "sources": ["203.0.113.0/24"], "comment": "metrics"}],
    }, "--tags", "firewall_validate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok=" in proc.stdout and "failed=0" in proc.stdout


# --- SSH must not be open to the controller's current address only --------------------

@pytest.mark.parametrize(("extra_vars", "expected"), [
    ({}, ["firewall_admin_networks (default: cluster_admin_networks) is empty",
          "locked out", "Set cluster_admin_networks", "firewall_controller_only: true"]),
    ({"cluster_admin_networks": []}, ["is empty", "firewall_controller_only: true"]),
    ({"firewall_controller_only": True, "cluster_admin_networks": ["192.0.2.0/24"]},
     ["firewall_controller_only is true", "192.0.2.0/24", "not both"]),
    ({"firewall_controller_only": True, "firewall_allow_controller": False},
     ["firewall_controller_only is true but firewall_allow_controller is false",
      "open to no one"]),
])
def test_ssh_only_from_this_runs_address_is_refused_before_anything_runs(tmp_path, extra_vars,
                                                                          expected):
    proc = run_role(tmp_path, extra_vars)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    for text in expected:
        assert text in out, f"{text!r} missing from the failure:\n{out}"
    assert AFTER_VALIDATION not in out, out


def test_controller_only_is_accepted_when_asked_for(tmp_path):
    proc = run_role(tmp_path, {"firewall_controller_only": True}, "--tags", "firewall_validate")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # the refusal was considered, and let the opt-in through
    assert "TASK [firewall : Refuse a firewall that lets SSH in from the controller's" in out, out


# --- provisioning as a login user with sudo ------------------------------------------

# TEST DOUBLE of sudo: like the real one it resets the environment (SSH_CLIENT is gone)
# and runs the command; it records each call.
FAKE_SUDO = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/sudo.log"
while [ $# -gt 0 ]; do
  case "$1" in
    -u) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
exec env -i PATH="$PATH" "$@"
"""

BECOME_PLAYBOOK = """\
- name: The firewall reads SSH_CLIENT as the login user, also under an inventory's become
  hosts: localhost
  gather_facts: false
  tasks:
    - name: A task that becomes root, as the inventory says
      ansible.builtin.command: id -u
      changed_when: false
    - name: Find the controller's address
      ansible.builtin.include_role:
        name: firewall
        tasks_from: controller.yml
      vars:
        firewall_over_ssh: true
        firewall_admin_networks: [198.51.100.0/24]
    - name: Show it
      ansible.builtin.debug:
        msg: "controller address: [{{ firewall_controller_address }}]"
"""


def test_ssh_client_is_read_without_sudo_when_the_inventory_says_become(tmp_path):
    """`ansible_become: true` in the inventory outranks a task's `become: false` keyword;
    under sudo SSH_CLIENT is empty and the controller's address would be lost."""
    sudo = tmp_path / "sudo"
    sudo.write_text(FAKE_SUDO)
    sudo.chmod(0o755)
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        f"localhost ansible_connection=local ansible_python_interpreter={sys.executable} "
        f"ansible_become=true ansible_become_exe={sudo}\n")
    playbook = tmp_path / "play.yml"
    playbook.write_text(BECOME_PLAYBOOK)
    env = dict(os.environ,
               ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_ROLES_PATH=str(REPO / "roles"),
               ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               # this test runs as root: become root through the fake sudo all the same
               ANSIBLE_BECOME_ALLOW_SAME_USER="true",
               SSH_CLIENT="192.0.2.7 51234 22")
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory),
         str(playbook)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "controller address: [192.0.2.7]" in out, out
    # become was in force for the play (the first task went through sudo), and only for it
    calls = (tmp_path / "sudo.log").read_text().splitlines()
    assert len(calls) == 1, calls


def test_no_role_or_playbook_turns_become_off_with_the_keyword():
    """`become: false` on a task or play loses against an inventory's `ansible_become: true`;
    `vars: {ansible_become: false}` is what works."""
    offenders = []
    for path in sorted([*(REPO / "roles").rglob("*.yml"), *(REPO / "playbooks").glob("*.yml"),
                        REPO / "site.yml"]):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip().startswith("become: false") or line.strip().startswith("become: no"):
                offenders.append(f"{path.relative_to(REPO)}:{number}")
    assert offenders == [], offenders
