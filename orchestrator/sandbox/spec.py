"""What a sandbox is made of, and the Ansible inventory written for it."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from ..errors import SandboxError

LABEL = "clustertrain.sandbox"
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,29}$")
FIRST_HOST = 10  # node addresses start at .10 of the sandbox subnet
SHARED_PATH = "/mnt/cluster"
EXPORT_PATH = "/srv/nfs/cluster"
# Settings that describe what the sandbox's nodes are (containers on a kernel without
# NFS, no conda downloads); merged into the inventory's `all.vars`.
SANDBOX_VARS_FILE = Path(__file__).resolve().parents[2] / "sandbox" / "group_vars" / "all.yml"


def state_root() -> Path:
    base = os.environ.get("CLUSTERTRAIN_STATE_DIR") or \
        os.path.join(os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"),
                     "clustertrain")
    return Path(base) / "sandboxes"


def validate_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise SandboxError(
            f"invalid sandbox name {name!r}: use 1-30 lowercase letters, digits and '-', "
            "starting with a letter (for example --name demo)")
    return name


@dataclass(frozen=True)
class Node:
    name: str          # inventory name, also the container's hostname
    container: str     # podman container name
    address: str
    outsider: bool = False


@dataclass
class SandboxSpec:
    name: str
    nodes: int
    outsiders: int = 0
    subnet: str = ""
    state_dir: Path = field(default_factory=Path)

    def __post_init__(self) -> None:
        validate_name(self.name)
        if not 1 <= self.nodes <= 64:
            raise SandboxError(f"--nodes {self.nodes}: a sandbox has 1 to 64 nodes")
        if not 0 <= self.outsiders <= 8:
            raise SandboxError(f"--outsiders {self.outsiders}: a sandbox has 0 to 8 outsiders")
        if not self.state_dir or self.state_dir == Path():
            self.state_dir = state_root() / self.name

    @property
    def key_path(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def inventory_path(self) -> Path:
        return self.state_dir / "inventory.yml"

    @property
    def share_dir(self) -> Path:
        return self.state_dir / "share"

    def members(self) -> list[Node]:
        if not self.subnet:
            raise SandboxError("internal: the sandbox subnet is not known yet")
        net = ipaddress.ip_network(self.subnet)
        hosts = [str(net.network_address + FIRST_HOST + i)
                 for i in range(self.nodes + self.outsiders)]
        if ipaddress.ip_address(hosts[-1]) not in net:
            raise SandboxError(f"subnet {self.subnet} is too small for "
                               f"{self.nodes + self.outsiders} containers")
        nodes = [Node(f"node{i}", f"{self.name}-node{i}", hosts[i]) for i in range(self.nodes)]
        nodes += [Node(f"outsider{i}", f"{self.name}-outsider{i}", hosts[self.nodes + i], True)
                  for i in range(self.outsiders)]
        return nodes


def render_inventory(spec: SandboxSpec, extra_vars: dict | None = None) -> str:
    """The inventory for `ansible-playbook site.yml -i ...` and every orchestrator command."""
    members = spec.members()
    train = {n.name: {"ansible_host": n.address, "cluster_address": n.address}
             for n in members if not n.outsider}
    outsiders = {n.name: {"ansible_host": n.address} for n in members if n.outsider}
    all_vars = {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(spec.key_path),
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={spec.known_hosts} "
                                   "-o StrictHostKeyChecking=yes",
        "ansible_python_interpreter": "/usr/bin/python3",
        "cluster_shared_path": SHARED_PATH,
        "cluster_nfs_export_path": EXPORT_PATH,
        "clustertrain_sandbox": spec.name,
        **(extra_vars or {}),
    }
    first = next(iter(train))
    inventory = {"all": {
        "vars": all_vars,
        "children": {
            "cluster": {"children": {
                "train_nodes": {"hosts": train},
                "nfs_server": {"hosts": {first: None}},
            }},
            "outsiders": {"hosts": outsiders or None},
        },
    }}
    header = (f"# Ansible inventory of sandbox {spec.name!r}, written by "
              f"`python -m orchestrator sandbox up`.\n"
              f"# Use it like a real inventory: ansible-playbook site.yml -i {spec.inventory_path}\n")
    return header + yaml.safe_dump(inventory, sort_keys=False, default_flow_style=False)


def sandbox_vars(path: Path = SANDBOX_VARS_FILE) -> dict:
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise SandboxError(f"{path} must hold a mapping of variables")
    return data


def describe(spec: SandboxSpec, states: dict[str, str] | None = None) -> dict:
    """The machine-readable view of a sandbox (`--json`)."""
    states = states or {}
    return {
        "name": spec.name,
        "inventory": str(spec.inventory_path),
        "key": str(spec.key_path),
        "share": str(spec.share_dir),
        "subnet": spec.subnet,
        "nodes": [dict(asdict(n), state=states.get(n.container, "unknown"))
                  for n in spec.members()],
    }
