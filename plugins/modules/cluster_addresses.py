#!/usr/bin/python
"""Resolve the cluster members' addresses to IP addresses, on the node that runs it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cluster_addresses
short_description: Resolve cluster members' addresses (IP or DNS name) to one IP each
description:
  - Runs on a cluster node and resolves each member's address with that node's own resolver
    (C(getaddrinfo), so C(/etc/hosts) and DNS as C(/etc/nsswitch.conf) says). DNS names that
    only the cluster network's DNS knows work, as long as the node can resolve them.
  - An address that is already an IP address is returned unchanged, without any lookup.
  - IPv4 is preferred; an IPv6 address is used when a name has no IPv4 address.
  - Loopback answers (such as Debian's C(127.0.1.1 <hostname>) line in C(/etc/hosts)) are
    never returned; for such a name the module asks DNS alone (C(getent -s dns)).
  - Fails, naming every host, variable and address that did not resolve.
  - Never changes anything (check mode supported).
options:
  members:
    description:
      - The addresses to resolve, each C({host, address, variable}); C(variable) names where
        the address came from (for the error message), e.g. C(cluster_address).
    type: list
    elements: dict
    required: true
  node:
    description: Name of the node that resolves, for the error message (its inventory name).
    type: str
    default: the node's host name
author: clustertrain
"""

RETURN = r"""
addresses:
  description: The IP address of each member, by its C(host).
  type: dict
  returned: success
details:
  description: Per member, C({address, variable, ip, resolved, all}) (all IPs found).
  type: dict
  returned: always
"""

# Imports follow DOCUMENTATION and RETURN, as in every Ansible module.
import ipaddress  # noqa: E402
import socket  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.clustertrain.cluster.plugins.module_utils.cluster_contract import (  # noqa: E402
    ip_literal,
)


def _usable(ip):
    addr = ipaddress.ip_address(ip)
    # IPv6 link-local addresses need an interface (scope) that other nodes do not share
    return not (addr.is_loopback or addr.is_unspecified
                or (addr.version == 6 and addr.is_link_local))


def choose(addresses):
    """The first usable IPv4 address, else the first usable IPv6 address, else None."""
    usable = [a for a in addresses if _usable(a)]
    v4 = [a for a in usable if ipaddress.ip_address(a).version == 4]
    v6 = [a for a in usable if ipaddress.ip_address(a).version == 6]
    return (v4 + v6 + [None])[0]


def lookup(name, getaddrinfo=socket.getaddrinfo):
    """Every address of a name, in the resolver's order, duplicates removed."""
    found = []
    for family, _type, _proto, _canon, sockaddr in getaddrinfo(name, None, 0, socket.SOCK_STREAM):
        if family in (socket.AF_INET, socket.AF_INET6):
            ip = sockaddr[0].split("%", 1)[0]
            if ip not in found:
                found.append(ip)
    return found


def describe(member):
    """'node1: cluster_address 'gpu01.ib'' for error messages."""
    variable = member.get("variable") or "cluster_address"
    text = "%s: %s '%s'" % (member["host"], variable, member["address"])
    if variable == "ansible_host":
        text += " (cluster_address is not set)"
    elif variable == "inventory_hostname":
        text += " (neither cluster_address nor ansible_host is set)"
    return text


def resolve_members(members, getaddrinfo=socket.getaddrinfo, dns_only=None):
    """Resolve every member; returns (addresses, details, errors).

    ``dns_only(name)`` returns a name's addresses from DNS alone (bypassing /etc/hosts), or
    an empty list; it is asked only when the resolver's answer was loopback and nothing else.
    """
    addresses, details, errors = {}, {}, []
    for member in members:
        host = str(member["host"])
        address = str(member.get("address") or "").strip()
        member = dict(member, host=host, address=address)
        entry: dict = {"address": address, "variable": member.get("variable") or "cluster_address",
                       "ip": None, "resolved": False, "all": []}
        details[host] = entry
        if not address:
            errors.append("%s is empty" % describe(member))
            continue
        literal = ip_literal(address)
        if literal is not None:
            entry.update(ip=literal, all=[literal])
            addresses[host] = literal
            continue
        try:
            found = lookup(address, getaddrinfo)
        except (socket.gaierror, UnicodeError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            errors.append("%s does not resolve (%s)" % (describe(member), reason))
            continue
        ip = choose(found)
        if ip is None and found and dns_only is not None:
            found_dns = dns_only(address)
            ip = choose(found_dns)
            found = found + [a for a in found_dns if a not in found]
        entry.update(all=found, resolved=True)
        if ip is None:
            errors.append(
                "%s resolves only to %s, which other nodes cannot reach (an /etc/hosts line "
                "such as Debian's '127.0.1.1 <hostname>'?)"
                % (describe(member), ", ".join(found) or "nothing"))
            continue
        entry["ip"] = ip
        addresses[host] = ip
    return addresses, details, errors


def failure_message(errors, node):
    return (
        "Cannot resolve the cluster addresses on %s: %s. Fix the variable named for each: "
        "a DNS name that resolves on the cluster nodes, or an IP address (for cluster "
        "members, set cluster_address in the inventory)."
        % (node, "; ".join(errors)))


def _getent_dns(module):
    def dns_only(name):
        rc, out, _err = module.run_command(["getent", "-s", "dns", "ahosts", name])
        if rc != 0:
            return []
        found = []
        for line in out.splitlines():
            fields = line.split()
            if fields and ip_literal(fields[0]) and fields[0] not in found:
                found.append(fields[0])
        return found
    return dns_only


def main():
    module = AnsibleModule(
        argument_spec={"members": {"type": "list", "elements": "dict", "required": True},
                       "node": {"type": "str", "default": ""}},
        supports_check_mode=True,
    )
    bad = [m for m in module.params["members"] if "host" not in m or "address" not in m]
    if bad:
        module.fail_json(msg="members: every entry needs host and address, got %s" % bad)
    addresses, details, errors = resolve_members(
        module.params["members"], dns_only=_getent_dns(module))
    if errors:
        module.fail_json(msg=failure_message(errors, module.params["node"] or socket.gethostname()),
                         details=details)
    module.exit_json(changed=False, addresses=addresses, details=details)


if __name__ == "__main__":
    main()
