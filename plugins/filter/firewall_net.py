"""Address and port filters for the firewall role (Python's ipaddress, no netaddr
needed)."""

from __future__ import annotations

import importlib.util
import ipaddress
import os


def _load_contract():
    """The collection's plugins/module_utils/cluster_contract.py, next to this file's
    directory in every layout (the repository, an installed collection, the wheel): its
    port-range rule is the one the orchestrator applies to cluster_ring_ports."""
    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), os.pardir,
                        "module_utils", "cluster_contract.py")
    spec = importlib.util.spec_from_file_location("clustertrain_cluster_contract", path)
    assert spec is not None and spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


contract = _load_contract()


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


def firewall_port_range_problem(text):
    """What is wrong with the port range TEXT ("LOW-HIGH"), or "" when nothing is."""
    try:
        contract.port_range(text)
    except ValueError as exc:
        return str(exc)
    return ""


def firewall_port_range(text):
    """The port range TEXT as nftables writes it: "LOW-HIGH", or "LOW" when HIGH is LOW."""
    low, high = contract.port_range(text)
    return str(low) if low == high else f"{low}-{high}"


class FilterModule:
    def filters(self):
        return {
            "firewall_invalid_networks": firewall_invalid_networks,
            "firewall_invalid_addresses": firewall_invalid_addresses,
            "firewall_networks": firewall_networks,
            "firewall_port_range_problem": firewall_port_range_problem,
            "firewall_port_range": firewall_port_range,
        }
