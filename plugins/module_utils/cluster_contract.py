"""The node contract's rules, written once (clustertrain; standard library only).

It is the collection clustertrain.cluster's module_utils. Every part that needs one of
these rules uses this file: the filters of plugins/filter/cluster_members.py (on the
controller, loaded by path), the module `cluster_addresses` (on the nodes, shipped as the
collection's module_utils) and the orchestrator (loaded by path, orchestrator/contract.py).

- A member's address is its `cluster_address`, else its `ansible_host`, else its inventory
  name. A value that is empty or only blanks counts as not set; the address is used
  without surrounding blanks.
- An IP address literal is an IPv4 or IPv6 address; an IPv6 address may be in brackets.
- A port range (cluster_ring_ports) is written "LOW-HIGH", ports a user's process may
  bind: 1024 <= LOW <= HIGH <= 65535.
- A node is reached over SSH when its `ansible_connection` is unset or names the ssh or
  the paramiko connection plugin (ssh_plugin); the firewall keeps the controller's SSH
  in then, and the orchestrator reads that plugin's settings for its own SSH.
"""

import ipaddress
import re

# The lowest port a process without privileges may bind (Linux's default
# net.ipv4.ip_unprivileged_port_start): the runs' ports are bound by the users' processes.
UNPRIVILEGED_PORT = 1024
HIGHEST_PORT = 65535

# Where a member's address comes from, in order; the inventory name is the last resort.
ADDRESS_VARIABLES = ("cluster_address", "ansible_host")
FALLBACK_VARIABLE = "inventory_hostname"


# ansible_connection's values that log in over SSH, and the plugin each names.
SSH_PLUGINS = {name: plugin for plugin, names in (
    ("ssh", ("ssh", "smart", "ansible.builtin.ssh", "ansible.legacy.ssh")),
    ("paramiko_ssh", ("paramiko", "paramiko_ssh", "ansible.builtin.paramiko_ssh",
                      "ansible.legacy.paramiko_ssh"))) for name in names}


def _get(mapping, key):
    try:
        return mapping[key]
    except (KeyError, TypeError):
        return None


def member_address(host, host_vars):
    """(address, variable) of the inventory host HOST whose variables are HOST_VARS."""
    for variable in ADDRESS_VARIABLES:
        value = _get(host_vars, variable)
        if value is not None and str(value).strip():
            return str(value).strip(), variable
    return str(host), FALLBACK_VARIABLE


def ssh_plugin(connection):
    """The SSH connection plugin ("ssh" or "paramiko_ssh") that CONNECTION, a host's
    ansible_connection (None or empty: Ansible's default, ssh), names; None for a
    connection that is not SSH (local, a container's, winrm...)."""
    name = str(connection or "ssh").strip()
    return SSH_PLUGINS.get(name)


def ip_literal(text):
    """The address when TEXT is an IPv4/IPv6 address (IPv6 may be in brackets), else None."""
    text = str(text).strip()
    candidate = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ipaddress.ip_address(candidate)
    except ValueError:
        return None
    return candidate


def port_range(text):
    """(LOW, HIGH) of the port range TEXT, written "LOW-HIGH"; ValueError naming what is
    wrong when it is not a range of unprivileged ports."""
    match = re.fullmatch(r"([0-9]+)-([0-9]+)", str(text))
    if match is None:
        raise ValueError(f"{text!r} is not a port range: write it LOW-HIGH, e.g. 29700-29899")
    low, high = int(match.group(1)), int(match.group(2))
    if not UNPRIVILEGED_PORT <= low <= high <= HIGHEST_PORT:
        raise ValueError(
            f"{text!r} is not a range of unprivileged ports: give LOW-HIGH with "
            f"{UNPRIVILEGED_PORT} <= LOW <= HIGH <= {HIGHEST_PORT}, e.g. 29700-29899")
    return low, high
