"""The node contract as the orchestrator reads it, from the roles' own files.

The rules (a member's address, what an IP address is) live once, in the collection's
plugins/module_utils/cluster_contract.py, which the roles use too; the orchestrator loads
that file by path (resources.Project.plugin, in a checkout or the wheel) rather than
keeping a copy. Node paths the roles make configurable are read
the way the roles read them: the inventory variable, else the role's default
(roles/<role>/defaults/main.yml), never a second literal here.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import yaml

from .errors import InventoryError
from .resources import project


def rules() -> ModuleType:
    """The collection's plugins/module_utils/cluster_contract.py as a module."""
    return project().plugin("module_utils", "cluster_contract")


def member_address(host: str, host_vars: dict[str, Any]) -> str:
    """The address the other nodes use for HOST (cluster_address, else ansible_host, else
    the inventory name; an empty value counts as not set)."""
    address: str = rules().member_address(host, host_vars)[0]
    return address


def is_ip(text: str) -> bool:
    """Whether TEXT is an IPv4/IPv6 address (not a DNS name)."""
    return rules().ip_literal(text) is not None


@functools.cache
def _defaults(role: str) -> dict[str, Any]:
    path = project().roles / role / "defaults" / "main.yml"
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise InventoryError(f"{path} is not a mapping of variables")
    return data


def role_default(role: str, variable: str) -> Any:
    """The default the role ROLE gives VARIABLE (a plain value, not an expression)."""
    value = _defaults(role).get(variable)
    if value is None or (isinstance(value, str) and "{{" in value):
        raise InventoryError(f"roles/{role}/defaults/main.yml has no plain default for "
                             f"{variable}; give it one there (the orchestrator reads it)")
    return value
