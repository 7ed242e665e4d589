"""Cluster members' addresses on the controller side (the common role).

A member's address is its `cluster_address`, else its `ansible_host`, else its inventory
name; it may be an IP address or a DNS name. Names are resolved on the nodes (module
`cluster_addresses`) into the fact `common_cluster_ips` ({inventory name: IP}); these
filters pick the addresses to resolve and turn the result into what needs IPs.
"""

from __future__ import annotations

import ipaddress

# Where a member's address comes from, in order.
ADDRESS_VARIABLES = ("cluster_address", "ansible_host")


def _is_ip(text):
    try:
        ipaddress.ip_address(str(text).strip().strip("[]"))
    except ValueError:
        return False
    return True


def _get(mapping, key):
    try:
        return mapping[key]
    except (KeyError, TypeError):
        return None


def common_member_addresses(hosts, hostvars):
    """[{host, address, variable}] of the given inventory hosts, for `cluster_addresses`."""
    members = []
    for host in hosts or []:
        host_vars = _get(hostvars, host) or {}
        for variable in ADDRESS_VARIABLES:
            value = _get(host_vars, variable)
            if value is not None and str(value).strip():
                members.append({"host": host, "address": str(value).strip(), "variable": variable})
                break
        else:
            members.append({"host": host, "address": host, "variable": "inventory_hostname"})
    return members


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
    dns_names = {m["address"].lower() for m in members if not _is_ip(m["address"])}
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
            "common_member_addresses": common_member_addresses,
            "common_unresolved": common_unresolved,
            "common_hosts_lines": common_hosts_lines,
        }
