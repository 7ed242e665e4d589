"""The inventory variables the orchestrator reads, each declared once with its kind, and
the check of a value Ansible's loader gave (rendered) against it.

Values come as Ansible reads them: a YAML inventory's typed, an INI one's as Python
literals where they are one (`29600`, `True`) and text otherwise (`false`, `22abc`); a
kind takes what Ansible's own type of the variable takes (a whole number written as
text, a boolean written yes/no) and nothing else: a list or a mapping where text is
declared is refused, never turned into its text. The choices of a variable the roles
declare (roles/*/meta/argument_specs.yml) are read from there.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .. import contract, defaults
from ..errors import InventoryError
from ..resources import project


class Refused(ValueError):
    """A value that is not of its variable's kind; the message says what it must be."""


def shown(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return repr(value if not isinstance(value, str) else str(value))


def text(value: Any) -> str:
    """VALUE when it is text (not empty); Refused otherwise."""
    if not isinstance(value, str):
        raise Refused(f"must be text, not {shown(value)}")
    if not value.strip():
        raise Refused("must not be empty")
    return str(value)


# A DNS name (or an /etc/hosts or ~/.ssh/config name): labels of letters, digits, '_' and
# '-', not starting or ending with '-', joined by dots (one may end it). A name whose last
# label is all digits is a mistyped IPv4 address (10.0.0.300), not a name.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_HOST_HELP = ("give a host name (letters, digits, '-', '_' and '.', e.g. gpu-1.example.org) "
             "or an IP address")
# A login name: letters, digits, '_', '.', '-' (not first) and '@' for a directory's
# users (alice@example.org), as OpenSSH's User option takes them.
_LOGIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}\$?")
# A group name, as groupadd takes it (sudo, wheel, ml-admins).
_GROUP = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}\$?")


def address(value: Any) -> str:
    """VALUE when it is an IP address or a host name; Refused otherwise."""
    given = text(value).strip()
    if contract.is_ip(given):
        return given
    if (len(given) <= 253 and _HOST_NAME.fullmatch(given)
            and not given.rstrip(".").rpartition(".")[2].isdigit()):
        return given
    raise Refused(f"{shown(given)} is not a host name or an IP address; {_HOST_HELP}")


def login(value: Any) -> str:
    given = text(value)
    if not _LOGIN.fullmatch(given):
        raise Refused(f"{shown(given)} is not a login name; give the user SSH logs in as "
                      "(letters, digits, '_', '.', '-', not starting with '-'), e.g. trainer")
    return given


def group(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        raise Refused(f"{value} is not a group name; give the group's name (e.g. wheel), "
                      "not its number")
    given = text(value)
    if not _GROUP.fullmatch(given):
        raise Refused(f"{shown(given)} is not a group name; give one such as sudo or wheel "
                      "(letters, digits, '_', '.', '-', starting with a letter)")
    return given


def _no_controls(given: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in given):
        raise Refused(f"{shown(given)} has a control character; remove it")
    return given


def absolute_path(value: Any) -> str:
    given = _no_controls(text(value))
    if not given.startswith("/"):
        raise Refused(f"{shown(given)} is not an absolute path; give one starting with '/', "
                      "the same on every node")
    return given


def node_path(value: Any) -> str:
    """An absolute path, or one under the login's home (~/...)."""
    given = _no_controls(text(value))
    if not given.startswith(("/", "~/")):
        raise Refused(f"{shown(given)} is not an absolute path; give one starting with '/' "
                      "(or '~/')")
    return given


def plain_text(value: Any) -> str:
    return _no_controls(text(value))


def _scalar(value: Any, what: str) -> Any:
    if isinstance(value, list | tuple | dict):
        raise Refused(f"must be {what}, not {shown(value)}")
    return value


def whole(value: Any) -> int:
    """VALUE as a whole number: an int (not a boolean), or one written as text."""
    if isinstance(_scalar(value, "a whole number"), int) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[-+]?[0-9]+\s*", value):
        return int(value)
    raise Refused(f"{shown(value)} is not a whole number")


def number(value: Any) -> float:
    """VALUE as a finite number: an int or a float (not a boolean), or one as text."""
    found = math.nan
    if isinstance(_scalar(value, "a number"), int | float) and not isinstance(value, bool):
        found = float(value)
    elif isinstance(value, str):
        try:
            found = float(value)
        except ValueError:
            pass
    if not math.isfinite(found):
        raise Refused(f"{shown(value)} is not a number")
    return found


def amount(value: Any) -> float:
    """A number of 0 or more."""
    found = number(value)
    if found < 0:
        raise Refused(f"{shown(value)} is below 0")
    return found


def flag(value: Any) -> bool:
    """VALUE as a boolean, as Ansible's bool type reads it (true/false, yes/no, 1/0...)."""
    from ansible.module_utils.parsing.convert_bool import boolean

    _scalar(value, "true or false")
    try:
        return boolean(value, strict=True)
    except TypeError:
        raise Refused(f"{shown(value)} is not true or false") from None


def port(low: int, why: str = "") -> Callable[[Any], int]:
    """A port from LOW to 65535 (WHY: why not lower, for the message)."""
    def check(value: Any) -> int:
        try:
            found = whole(value)
        except Refused:
            found = -1
        if not low <= found <= contract.rules().HIGHEST_PORT:
            kind = "an unprivileged port" if low > 1 else "a port"
            raise Refused(f"{shown(value)} is not {kind}; give a whole number "
                          f"{low}-{contract.rules().HIGHEST_PORT}{why}")
        return found
    return check


def port_range(value: Any) -> str:
    given = text(value)
    try:
        contract.rules().port_range(given)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    return given


def fstypes(value: Any) -> list[str]:
    """One filesystem type or a list of them."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) and re.fullmatch(
            r"[A-Za-z0-9_.-]+", i) for i in items):
        raise Refused(f"must be a type or a list of types, not {shown(value)}; e.g. "
                      "[nfs, nfs4]")
    return list(items)


@functools.cache
def role_choices(role: str, variable: str) -> tuple[str, ...]:
    """The values roles/ROLE/meta/argument_specs.yml allows VARIABLE."""
    path = project().roles / role / "meta" / "argument_specs.yml"
    spec = yaml.safe_load(path.read_text())["argument_specs"]["main"]["options"][variable]
    return tuple(str(c) for c in spec["choices"])


def choice(role: str, variable: str) -> Callable[[Any], str]:
    """One of the values the role ROLE allows VARIABLE, with a guess at a misspelt one."""
    def check(value: Any) -> str:
        allowed = role_choices(role, variable)
        given = text(value)
        if given in allowed:
            return given
        near = difflib.get_close_matches(given, allowed, n=1)
        raise Refused(f"{shown(given)} is not one of {', '.join(allowed)}"
                      + (f" (did you mean {near[0]!r}?)" if near else ""))
    return check


@dataclass(frozen=True)
class Variable:
    """An inventory variable the orchestrator reads: CHECK gives its value or raises
    Refused (saying the fix, or HELP does); PER_NODE: read for every node (else the first
    node's is the cluster's)."""

    name: str
    check: Callable[[Any], Any]
    help: str = ""
    per_node: bool = False


_RENDEZVOUS_WHY = (" (the users' training processes bind it, and a port below 1024 "
                   f"needs root; default {defaults.RENDEZVOUS_PORT})")

VARIABLES: tuple[Variable, ...] = (
    Variable("cluster_address", address, per_node=True),
    Variable("ansible_python_interpreter", plain_text,
             f"give the node's python, e.g. {defaults.NODE_PYTHON}", per_node=True),
    Variable("python_env_state_dir", node_path, per_node=True),
    Variable("common_cluster_env_file", node_path, per_node=True),
    Variable("cluster_shared_path", absolute_path),
    Variable("cluster_rendezvous_port", port(1024, _RENDEZVOUS_WHY)),
    Variable("cluster_rendezvous_port_span", whole, "give the number of master ports a run "
             f"may take, from cluster_rendezvous_port up (default {defaults.RENDEZVOUS_SPAN})"),
    Variable("cluster_scheduler", choice("contract", "cluster_scheduler")),
    Variable("python_env_backend", choice("python_env", "python_env_backend")),
    Variable("cluster_ring_ports", port_range),
    Variable("cluster_admin_group", group),
    Variable("cluster_min_free_gb", amount, "give the GiB a run needs free on the share and "
             "on each node's home and temporary directory, a number of 0 or more (default "
             f"{defaults.MIN_FREE_GB:g})"),
    Variable("cluster_shared_fstypes", fstypes),
    Variable("nfs_client_kernel_mount", flag, "give true (the nfs_client role mounts the "
             "share with the kernel, the default) or false"),
)
NAMES = tuple(v.name for v in VARIABLES)


def refusal(name: str, path: Path, reason: str, fix: str = "", host: str = "") -> str:
    """The error for NAME's value in the inventory PATH (of HOST, for a node's own)."""
    return f"{host + ': ' if host else ''}{name} in {path}: {reason}" + (f"; {fix}" if fix
                                                                      else "")


def check(variable: Variable, value: Any, path: Path, host: str = "") -> Any:
    """VALUE as VARIABLE's kind reads it (None: not set); InventoryError naming HOST (for
    a node's own variable), the variable, the inventory PATH and the fix otherwise."""
    return checked(variable.name, variable.check, value, path, host, variable.help)


def checked(name: str, kind: Callable[[Any], Any], value: Any, path: Path, host: str = "",
            fix: str = "") -> Any:
    """VALUE of the variable NAME as KIND reads it (None: not set, as is empty text or
    blanks, the contract's rule); InventoryError else."""
    if value is None or isinstance(value, str) and not value.strip():
        return None
    try:
        return kind(value)
    except Refused as exc:
        raise InventoryError(refusal(name, path, str(exc), fix, host)) from None
