"""The node contract's rules, written once (clustertrain; standard library only).

It is the collection clustertrain.cluster's module_utils. Every part that needs one of
these rules uses this file: the filters of plugins/filter/cluster_members.py (on the
controller, loaded by path), the module `cluster_addresses` (on the nodes, shipped as the
collection's module_utils) and the orchestrator (loaded by path, orchestrator/cluster/contract.py).

- A member's address is its `cluster_address`, else its `ansible_host`, else its inventory
  name. A value that is empty or only blanks counts as not set; the address is used
  without surrounding blanks.
- An IP address literal is an IPv4 or IPv6 address; an IPv6 address may be in brackets.
"""

import ipaddress

# Where a member's address comes from, in order; the inventory name is the last resort.
ADDRESS_VARIABLES = ("cluster_address", "ansible_host")
FALLBACK_VARIABLE = "inventory_hostname"


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


def ip_literal(text):
    """The address when TEXT is an IPv4/IPv6 address (IPv6 may be in brackets), else None."""
    text = str(text).strip()
    candidate = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ipaddress.ip_address(candidate)
    except ValueError:
        return None
    return candidate
