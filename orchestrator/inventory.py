"""The cluster as the Ansible inventory describes it (read through Ansible's own loader).

The same file `ansible-playbook site.yml -i ...` uses: INI or YAML, with group_vars and
host_vars next to it. Training nodes are the hosts of group `train_nodes`, in order;
the first one is node 0 (rank 0, the master).
"""

from __future__ import annotations

import ipaddress
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InventoryError

DEFAULT_INVENTORY = Path("inventory/hosts.yml")
TRAIN_GROUP = "train_nodes"
DEFAULT_SHARED_PATH = "/mnt/cluster"
DEFAULT_RENDEZVOUS_PORT = 29500


@dataclass(frozen=True)
class NodeSpec:
    """One training node: how to reach it over SSH and how the others reach it."""

    name: str
    host: str                       # ansible_host: where SSH connects
    cluster_address: str            # what the other nodes use (master address on node 0)
    user: str = "root"
    port: int = 22
    key_file: str | None = None
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts
    host_key_checking: str = "yes"  # yes | accept-new | no (from StrictHostKeyChecking)
    python: str = "/usr/bin/python3"  # the node's system python (for probes and teardown)


@dataclass(frozen=True)
class Cluster:
    inventory: Path
    nodes: tuple[NodeSpec, ...]
    shared_path: str = DEFAULT_SHARED_PATH
    rendezvous_port: int = DEFAULT_RENDEZVOUS_PORT
    variables: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def select(self, nodes: int | None = None, hosts: str | None = None) -> "Cluster":
        """`--nodes N` (the first N) or `--hosts a,b` (by name, kept in inventory order)."""
        if nodes is not None and hosts:
            raise InventoryError("give either --nodes N or --hosts a,b, not both")
        chosen = list(self.nodes)
        if nodes is not None:
            if nodes < 1:
                raise InventoryError(f"--nodes {nodes}: a job needs at least 1 node")
            if nodes > len(self.nodes):
                raise InventoryError(
                    f"--nodes {nodes}: the inventory {self.inventory} has only "
                    f"{len(self.nodes)} node(s) in group '{TRAIN_GROUP}' "
                    f"({', '.join(self.names)}); use --nodes {len(self.nodes)} or fewer, "
                    "or add hosts to the inventory")
            chosen = chosen[:nodes]
        elif hosts:
            wanted = [h.strip() for h in hosts.split(",") if h.strip()]
            unknown = [h for h in wanted if h not in self.names]
            if unknown:
                raise InventoryError(
                    f"--hosts: unknown host(s) {', '.join(unknown)}; the inventory "
                    f"{self.inventory} has {', '.join(self.names)} in group '{TRAIN_GROUP}'")
            if len(set(wanted)) != len(wanted):
                raise InventoryError(f"--hosts {hosts}: a host is named twice")
            # Inventory order decides which node is node 0, whatever order --hosts uses.
            chosen = [n for n in self.nodes if n.name in wanted]
        return Cluster(self.inventory, tuple(chosen), self.shared_path,
                       self.rendezvous_port, self.variables)


def _ssh_options(args: str) -> dict[str, str]:
    """`-o Key=Value` pairs (keys lower-cased) from ansible_ssh_common_args/extra_args."""
    opts: dict[str, str] = {}
    words = shlex.split(args)
    i = 0
    while i < len(words):
        word = words[i]
        value = None
        if word == "-o" and i + 1 < len(words):
            value = words[i + 1]
            i += 1
        elif word.startswith("-o") and len(word) > 2:
            value = word[2:]
        if value:
            key, _, val = value.replace(" ", "=", 1).partition("=")
            opts[key.strip().lower()] = val.strip()
        i += 1
    return opts


def _load_ansible(path: Path):
    # Imported here so that `--help` and unit tests of other modules stay fast.
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(path)])
    return loader, inventory, VariableManager(loader=loader, inventory=inventory), Templar


def load_cluster(path: str | os.PathLike[str] = DEFAULT_INVENTORY) -> Cluster:
    path = Path(path)
    if not path.exists():
        raise InventoryError(
            f"inventory {path} does not exist; pass the one site.yml uses with "
            "-i/--inventory (a sandbox's is in "
            "~/.local/state/clustertrain/sandboxes/NAME/inventory.yml)")
    loader, inventory, variables, templar_cls = _load_ansible(path)
    group = inventory.groups.get(TRAIN_GROUP)
    hosts = group.get_hosts() if group is not None else []
    if not hosts:
        raise InventoryError(
            f"inventory {path} has no hosts in group '{TRAIN_GROUP}'; list the training "
            "nodes there in order (the first is node 0, see docs/CONVENTIONS.md)")
    nodes = []
    first_vars: dict[str, Any] = {}
    for host in hosts:
        hv = variables.get_vars(host=host)
        templar = templar_cls(loader=loader, variables=hv)
        hv = {k: templar.template(v) for k, v in hv.items()
              if k.startswith(("ansible_", "cluster_"))}
        if not first_vars:
            first_vars = hv
        nodes.append(_node(host.name, hv, path))
    try:
        port = int(first_vars.get("cluster_rendezvous_port", DEFAULT_RENDEZVOUS_PORT))
    except (TypeError, ValueError):
        raise InventoryError(f"cluster_rendezvous_port in {path} must be a port number, "
                             f"not {first_vars.get('cluster_rendezvous_port')!r}") from None
    return Cluster(path, tuple(nodes),
                   str(first_vars.get("cluster_shared_path") or DEFAULT_SHARED_PATH),
                   port, first_vars)


def _node(name: str, hv: dict[str, Any], path: Path) -> NodeSpec:
    host = str(hv.get("ansible_host") or name)
    cluster_address = str(hv.get("cluster_address") or host)
    try:
        ipaddress.ip_address(cluster_address)
    except ValueError:
        raise InventoryError(
            f"{name}: cluster_address {cluster_address!r} is not an IP address; set "
            f"cluster_address (or ansible_host) for {name} in {path} to the IP the other "
            "nodes reach it at") from None
    opts = _ssh_options(" ".join(str(hv.get(k) or "") for k in
                                 ("ansible_ssh_common_args", "ansible_ssh_extra_args")))
    checking = opts.get("stricthostkeychecking", "yes").lower()
    checking = {"true": "yes", "false": "no", "off": "no", "ask": "yes"}.get(checking, checking)
    if checking not in ("yes", "no", "accept-new"):
        checking = "yes"
    known = opts.get("userknownhostsfile")
    if known:
        known = os.path.expanduser(known.split()[0])
    key = hv.get("ansible_ssh_private_key_file") or hv.get("ansible_private_key_file")
    try:
        port = int(hv.get("ansible_port") or hv.get("ansible_ssh_port") or 22)
    except (TypeError, ValueError):
        raise InventoryError(f"{name}: ansible_port must be a number in {path}") from None
    interpreter = str(hv.get("ansible_python_interpreter") or "/usr/bin/python3")
    if "{{" in interpreter or "auto" in interpreter:
        interpreter = "/usr/bin/python3"
    return NodeSpec(name=name, host=host, cluster_address=cluster_address,
                    user=str(hv.get("ansible_user") or os.environ.get("USER") or "root"),
                    port=port, key_file=os.path.expanduser(str(key)) if key else None,
                    known_hosts=known, host_key_checking=checking, python=interpreter)
