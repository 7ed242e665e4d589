"""What a sandbox is made of, and the SSH config and Ansible inventories written for it.

A sandbox plays a real site: nodes are reached by name through an ssh_config (the
way many users reach their servers), as a non-root login user with sudo (alice) or
without (bob); root cannot log in. With a bastion, the nodes accept SSH only from the
bastion and from each other, and the ssh_config jumps through it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from .. import contract, defaults
from ..errors import SandboxError
from ..resources import project

LABEL = "clustertrain.sandbox"
NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,29}")
FIRST_HOST = 10  # node addresses start at .10 of the sandbox subnet (then outsiders, bastion)
SHARED_PATH = defaults.SHARED_PATH
EXPORT_PATH = str(contract.role_default("contract", "cluster_nfs_export_path"))




@dataclass(frozen=True)
class LoginUser:
    name: str
    uid: int           # the same on every node (and its group's gid)
    sudo: bool         # passwordless sudo through /etc/sudoers.d


# The login users of every sandbox node; alice provisions (become), bob cannot. They are
# baked into the node image (image.py); a sandbox may add researchers (`sandbox up
# --users carol,dave`), made on its containers when they boot (cluster.py).
USERS = (LoginUser("alice", 1001, True), LoginUser("bob", 1002, False))
ADMIN_USER = USERS[0]
USER_RE = re.compile(r"[a-z][a-z0-9]{0,15}")
MAX_EXTRA_USERS = 8
BASTION = "bastion"
# The nftables table (in each node's own network namespace) that keeps the host out
# of SSH in bastion mode; the firewall role owns another table and leaves this one.
BASTION_TABLE = "sandbox_bastion"


def state_root() -> Path:
    base = os.environ.get("CLUSTERTRAIN_STATE_DIR") or \
        os.path.join(os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"),
                     "clustertrain")
    return Path(base) / "sandboxes"


def validate_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
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


def default_gateway(subnet: str) -> str:
    """podman's gateway when it names none: the subnet's first address."""
    return str(ipaddress.ip_network(subnet).network_address + 1) if subnet else ""


@dataclass
class SandboxSpec:
    name: str
    nodes: int
    outsiders: int = 0
    subnet: str = ""
    state_dir: Path = field(default_factory=Path)
    bastion: bool = False
    gateway: str = ""   # the network's gateway: the host (controller) as the nodes see it
    slurm: bool = False  # the inventories say cluster_scheduler: slurm
    extra_users: tuple[str, ...] = ()   # researchers beyond USERS (no sudo), by name

    def __post_init__(self) -> None:
        validate_name(self.name)
        self.extra_users = validate_users(self.extra_users)
        if not 1 <= self.nodes <= 64:
            raise SandboxError(f"--nodes {self.nodes}: a sandbox has 1 to 64 nodes")
        if not 0 <= self.outsiders <= 8:
            raise SandboxError(f"--outsiders {self.outsiders}: a sandbox has 0 to 8 outsiders")
        if not self.state_dir or self.state_dir == Path():
            self.state_dir = state_root() / self.name
        if not self.gateway:
            self.gateway = default_gateway(self.subnet)

    @property
    def users(self) -> tuple[LoginUser, ...]:
        """Every login user of its nodes: USERS, then the extra researchers (uids after
        USERS', in the order given: the same on every node)."""
        last = max(u.uid for u in USERS)
        return USERS + tuple(LoginUser(name, last + 1 + i, False)
                             for i, name in enumerate(self.extra_users))

    def user(self, name: str) -> LoginUser:
        for u in self.users:
            if u.name == name:
                return u
        raise SandboxError(f"sandbox {self.name!r} has no login user {name!r} (it has "
                           f"{', '.join(u.name for u in self.users)}; add researchers with "
                           "`sandbox up --users NAME,NAME`)")

    @property
    def key_path(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def inventory_path(self) -> Path:
        """The inventory of the admin user (alice, with sudo)."""
        return self.inventory_for(ADMIN_USER.name)

    @property
    def ssh_config(self) -> Path:
        """The ssh_config of the admin user (alice)."""
        return self.ssh_config_for(ADMIN_USER.name)

    def inventory_for(self, user: str) -> Path:
        return self.state_dir / ("inventory.yml" if user == ADMIN_USER.name
                                 else f"inventory-{user}.yml")

    def ssh_config_for(self, user: str) -> Path:
        return self.state_dir / ("ssh_config" if user == ADMIN_USER.name
                                 else f"ssh_config-{user}")

    @property
    def share_dir(self) -> Path:
        return self.state_dir / "share"

    def _addresses(self) -> list[str]:
        if not self.subnet:
            raise SandboxError("internal: the sandbox subnet is not known yet")
        net = ipaddress.ip_network(self.subnet)
        count = self.nodes + self.outsiders + int(self.bastion)
        hosts = [str(net.network_address + FIRST_HOST + i) for i in range(count)]
        if ipaddress.ip_address(hosts[-1]) not in net or hosts[-1] == str(net.broadcast_address):
            raise SandboxError(f"subnet {self.subnet} is too small for {count} containers")
        return hosts

    def members(self) -> list[Node]:
        """The inventory's hosts: nodes, then outsiders (not the bastion)."""
        hosts = self._addresses()
        nodes = [Node(f"node{i}", f"{self.name}-node{i}", hosts[i]) for i in range(self.nodes)]
        nodes += [Node(f"outsider{i}", f"{self.name}-outsider{i}", hosts[self.nodes + i], True)
                  for i in range(self.outsiders)]
        return nodes

    def bastion_node(self) -> Node | None:
        if not self.bastion:
            return None
        return Node(BASTION, f"{self.name}-{BASTION}", self._addresses()[-1])

    def containers(self) -> list[Node]:
        """Every container of the sandbox: members, then the bastion if there is one."""
        bastion = self.bastion_node()
        return self.members() + ([bastion] if bastion else [])

    def admin_networks(self) -> list[str]:
        """Where SSH to the nodes comes from: the host (the network's gateway), and the
        bastion in bastion mode."""
        nets = [f"{self.gateway or default_gateway(self.subnet)}/32"]
        bastion = self.bastion_node()
        return nets + [f"{bastion.address}/32"] if bastion else nets


def validate_users(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """NAMES, extra login users of a sandbox, if each is a plain user name not already one
    of USERS and none is given twice; SandboxError saying which one is not, else."""
    names = tuple(names)
    base = {u.name for u in USERS}
    for name in names:
        if not USER_RE.fullmatch(name):
            raise SandboxError(f"--users: {name!r} is not a user name (1-16 lowercase letters "
                               "and digits, starting with a letter)")
        if name in base:
            raise SandboxError(f"--users: {name} is already a login user of every sandbox "
                               f"({', '.join(sorted(base))}); name only the extra ones")
    if len(set(names)) != len(names):
        raise SandboxError(f"--users {','.join(names)}: a user is named twice")
    if len(names) > MAX_EXTRA_USERS:
        raise SandboxError(f"--users: at most {MAX_EXTRA_USERS} extra users")
    return names


def _ssh_arg(value: object) -> str:
    """A value in ssh_config syntax (double quotes around one with blanks)."""
    text = str(value)
    return f'"{text}"' if re.search(r"\s", text) else text


def render_ssh_config(spec: SandboxSpec, user: str = ADMIN_USER.name) -> str:
    """An ssh_config with one block per container, as users keep in ~/.ssh/config:
    `ssh -F STATE/ssh_config node0` logs in by name. Host keys are pinned by address
    (OpenSSH looks them up by HostName) in STATE/known_hosts."""
    spec.user(user)
    bastion = spec.bastion_node()
    lines = [f"# SSH config of sandbox {spec.name!r} for user {user}, written by "
             "`python -m orchestrator sandbox up`.",
             f"# Log in: ssh -F {spec.ssh_config_for(user)} node0", ""]
    for node in spec.containers():
        lines += [f"Host {node.name}",
                  f"    HostName {node.address}",
                  f"    User {user}",
                  f"    IdentityFile {_ssh_arg(spec.key_path)}",
                  "    IdentitiesOnly yes",
                  f"    UserKnownHostsFile {_ssh_arg(spec.known_hosts)}",
                  "    StrictHostKeyChecking yes"]
        if bastion and node != bastion:
            lines.append(f"    ProxyJump {bastion.name}")
        lines.append("")
    return "\n".join(lines)


def render_inventory(spec: SandboxSpec, extra_vars: dict | None = None,
                     user: str = ADMIN_USER.name) -> str:
    """The inventory for `ansible-playbook site.yml -i ...` and every orchestrator command.

    Hosts have no ansible_host: SSH reaches them by name through the ssh_config
    (`-F`), and they reach each other by the same names (the network's DNS)."""
    login = spec.user(user)
    members = spec.members()
    train = {n.name: {"cluster_address": n.name} for n in members if not n.outsider}
    outsiders = {n.name: None for n in members if n.outsider}
    all_vars = {
        "ansible_python_interpreter": "/usr/bin/python3",
        "cluster_shared_path": SHARED_PATH,
        "cluster_nfs_export_path": EXPORT_PATH,
        "clustertrain_sandbox": spec.name,
        "cluster_users": [u.name for u in spec.users],
        **(extra_vars or {}),
        "cluster_scheduler": "slurm" if spec.slurm else "none",
        # How to log in, and from where: not overridable by the sandbox's group_vars.
        "ansible_user": login.name,
        "ansible_become": login.sudo,
        "ansible_ssh_common_args": f"-F {shlex.quote(str(spec.ssh_config_for(user)))}",
        # Ansible names its ControlMaster sockets by (host, port, user) only: every
        # sandbox has a node0 reached as alice, so with one shared directory a play on
        # one sandbox would reuse another sandbox's live connection (ControlPersist)
        # and run on the wrong machine. Each sandbox and user keeps its own.
        "ansible_control_path_dir": str(spec.state_dir / f"cp-{login.name}"),
        "cluster_admin_networks": spec.admin_networks(),
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
    header = (f"# Ansible inventory of sandbox {spec.name!r} for user {user}"
              f"{' (sudo)' if login.sudo else ' (no sudo)'}, written by "
              f"`python -m orchestrator sandbox up`.\n"
              f"# Use it like a real inventory: "
              f"ansible-playbook site.yml -i {spec.inventory_for(user)}\n")
    return header + yaml.safe_dump(inventory, sort_keys=False, default_flow_style=False)


def sandbox_vars(path: Path | None = None) -> dict:
    """Settings that describe what the sandbox's nodes are (containers on a kernel without
    NFS, no conda downloads), merged into the inventory's `all.vars`: PATH, by default the
    shipped sandbox/group_vars/all.yml."""
    path = path or project().sandbox_vars
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise SandboxError(f"{path} must hold a mapping of variables")
    return data


def describe(spec: SandboxSpec, states: dict[str, str] | None = None) -> dict:
    """The machine-readable view of a sandbox (`--json`)."""
    states = states or {}
    bastion = spec.bastion_node()
    return {
        "name": spec.name,
        "inventory": str(spec.inventory_path),
        "ssh_config": str(spec.ssh_config),
        "key": str(spec.key_path),
        "share": str(spec.share_dir),
        "subnet": spec.subnet,
        "gateway": spec.gateway,
        "slurm": spec.slurm,
        "users": {u.name: {"inventory": str(spec.inventory_for(u.name)),
                           "ssh_config": str(spec.ssh_config_for(u.name)),
                           "uid": u.uid, "sudo": u.sudo} for u in spec.users},
        "bastion": None if bastion is None else {
            "name": bastion.name, "address": bastion.address, "container": bastion.container,
            "state": states.get(bastion.container, "unknown")},
        "nodes": [dict(asdict(n), state=states.get(n.container, "unknown"))
                  for n in spec.members()],
    }
