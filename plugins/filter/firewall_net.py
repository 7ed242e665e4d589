"""Address filters for the firewall role (Python's ipaddress, no netaddr needed)."""

from __future__ import annotations

import ipaddress


def _network(value):
    return ipaddress.ip_network(str(value).strip(), strict=False)


def firewall_invalid_networks(values):
    """The entries of a list that are not an IPv4/IPv6 address or CIDR network."""
    bad = []
    for value in values or []:
        try:
            _network(value)
        except ValueError:
            bad.append(value)
    return bad


def firewall_invalid_addresses(values):
    """The entries of a list that are not a single IPv4/IPv6 address."""
    bad = []
    for value in values or []:
        try:
            ipaddress.ip_address(str(value).strip())
        except ValueError:
            bad.append(value)
    return bad


def firewall_networks(values, version):
    """Normalised networks of one IP version (4 or 6), duplicates removed, sorted."""
    nets = {_network(v) for v in values or []}
    return [str(n) for n in sorted(n for n in nets if n.version == int(version))]


class FilterModule:
    def filters(self):
        return {
            "firewall_invalid_networks": firewall_invalid_networks,
            "firewall_invalid_addresses": firewall_invalid_addresses,
            "firewall_networks": firewall_networks,
        }
