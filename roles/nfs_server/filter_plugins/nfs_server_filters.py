"""Filters the nfs_server role uses to check its client list before touching a node."""

from __future__ import annotations

import ipaddress


def nfs_server_invalid_clients(specs):
    """Return the entries of ``specs`` that are neither an IP address nor a CIDR network.

    A CIDR with host bits set (``10.0.0.1/24``) counts as invalid: it is almost always a
    typo for the network or for one host, and the two mean very different exports.
    """
    bad = []
    for spec in specs or []:
        text = str(spec).strip()
        try:
            if "/" in text:
                ipaddress.ip_network(text, strict=True)
            else:
                ipaddress.ip_address(text)
        except ValueError:
            bad.append(spec)
    return bad


class FilterModule:
    """Ansible entry point."""

    def filters(self):
        return {"nfs_server_invalid_clients": nfs_server_invalid_clients}
