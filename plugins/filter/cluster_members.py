"""Cluster members' addresses on the controller side (the common role).

A member's address is its `cluster_address`, else its `ansible_host`, else its inventory
name; it may be an IP address or a DNS name. Names are resolved on the nodes (module
`cluster_addresses`) into the fact `common_cluster_ips` ({inventory name: IP}); these
filters pick the addresses to resolve and turn the result into what needs IPs.
"""

from __future__ import annotations

import importlib.util
import os


def _load_contract():
    """The collection's plugins/module_utils/cluster_contract.py, next to this file's
    directory in every layout (the repository, an installed collection, the wheel): the
    rules, shared with the module `cluster_addresses` and the orchestrator."""
    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), os.pardir,
                        "module_utils", "cluster_contract.py")
    spec = importlib.util.spec_from_file_location("clustertrain_cluster_contract", path)
    assert spec is not None and spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


contract = _load_contract()


def _get(mapping, key):
    try:
        return mapping[key]
    except (KeyError, TypeError):
        return None


def common_member_address(host, hostvars):
    """The address of one inventory host (cluster_address, else ansible_host, else its name)."""
    return contract.member_address(host, _get(hostvars, host) or {})[0]


def common_member_addresses(hosts, hostvars):
    """[{host, address, variable}] of the given inventory hosts, for `cluster_addresses`."""
    members = []
    for host in hosts or []:
        address, variable = contract.member_address(host, _get(hostvars, host) or {})
        members.append({"host": host, "address": address, "variable": variable})
    return members


def common_over_ssh(connection):
    """Whether a host whose ansible_connection is CONNECTION is reached over SSH (the ssh
    or the paramiko plugin)."""
    return contract.ssh_plugin(connection) is not None


def common_unresolved(hosts, ips):
    """The hosts (in order, once each) that have no IP in `ips` yet."""
    known = ips or {}
    out = []
    for host in hosts or []:
        if host not in known and host not in out:
            out.append(host)
    return out


def common_hosts_lines(hosts, hostvars, ips):
    """Lines for the /etc/hosts block: '<IP> <inventory name> [<host name>]' per member.

    A name that is itself some member's cluster address (a DNS name) is left out: DNS
    already resolves it, and an /etc/hosts line would pin it to today's IP (and would be
    what the next run's resolution reads back).
    """
    members = common_member_addresses(hosts, hostvars)
    dns_names = {m["address"].lower() for m in members if contract.ip_literal(m["address"]) is None}
    lines = []
    for host in hosts or []:
        ip = (ips or {}).get(host)
        if not ip:
            continue
        facts = _get(_get(hostvars, host) or {}, "ansible_facts") or {}
        names = []
        for name in (host, _get(facts, "hostname") or host):
            if name and name not in names and str(name).lower() not in dns_names:
                names.append(str(name))
        if names:
            lines.append("%s %s" % (ip, " ".join(names)))
    return lines


class FilterModule:
    def filters(self):
        return {
            "common_member_address": common_member_address,
            "common_member_addresses": common_member_addresses,
            "common_unresolved": common_unresolved,
            "common_over_ssh": common_over_ssh,
            "common_hosts_lines": common_hosts_lines,
        }
