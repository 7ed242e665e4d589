"""The cluster as the Ansible inventory describes it (read through Ansible's own loader).

The same file `ansible-playbook site.yml -i ...` uses: INI or YAML, with group_vars and
host_vars next to it. Training nodes are the hosts of group `train_nodes`, in order;
the first one is node 0 (rank 0, the master). How each node is reached over SSH is
resolved by Ansible's configuration manager (ansible.cfg, ANSIBLE_* variables, host
variables, with Ansible's precedence), so the orchestrator connects exactly as
`ansible-playbook` does.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import contract, defaults
from ..errors import InventoryError
from ..node.protocol import ENV_NAME_PATTERN, ENVS_DIR
from . import inventory_schema as schema
from .ssh import SshTarget

TRAIN_GROUP = "train_nodes"


# Node paths the orchestrator reads: the inventory variable, else this role's default.
_ROLE_PATHS = {"python_env_state_dir": "python_env", "common_cluster_env_file": "common"}


def _role_path(variable: str) -> str:
    return str(contract.role_default(_ROLE_PATHS[variable], variable))


@dataclass(frozen=True)
class NodeSpec:
    """One training node: how to reach it over SSH and how the others reach it."""

    name: str
    ssh: SshTarget
    cluster_address: str            # what the other nodes use (an IP or a DNS name)
    python: str = defaults.NODE_PYTHON    # the node's system python (for probes and teardown)
    # Files the roles write on the node, where the inventory (else the role's default) puts
    # them: python_env.json and fingerprint.json (python_env), cluster.env (common).
    env_state_dir: str = field(default_factory=lambda: _role_path("python_env_state_dir"))
    cluster_env_file: str = field(default_factory=lambda: _role_path("common_cluster_env_file"))
    python_env: str | None = None   # a user's own environment (env create), else the cluster's

    @property
    def host(self) -> str:
        return self.ssh.host

    @property
    def user(self) -> str | None:
        return self.ssh.user


@dataclass(frozen=True)
class Cluster:
    inventory: Path
    nodes: tuple[NodeSpec, ...]
    shared_path: str = defaults.SHARED_PATH
    rendezvous_port: int = defaults.RENDEZVOUS_PORT
    variables: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def node(self, name: str) -> NodeSpec:
        return next(n for n in self.nodes if n.name == name)

    @property
    def scheduler(self) -> str:
        """The inventory's cluster_scheduler: none (runs over SSH) or slurm."""
        return str(self.variables.get("cluster_scheduler") or defaults.SCHEDULER)

    @property
    def rendezvous_span(self) -> int:
        """The inventory's cluster_rendezvous_port_span: the master ports a run may take,
        from rendezvous_port up."""
        value = self.variables.get("cluster_rendezvous_port_span")
        return defaults.RENDEZVOUS_SPAN if value is None else int(value)

    @property
    def admin_group(self) -> str:
        """The inventory's cluster_admin_group: its members may lift any user's cordon."""
        return str(self.variables.get("cluster_admin_group") or defaults.ADMIN_GROUP)

    @property
    def min_free_gb(self) -> float:
        """The inventory's cluster_min_free_gb: preflight refuses a run below this free on
        the share, a node's home or its temporary directory."""
        value = self.variables.get("cluster_min_free_gb")
        return defaults.MIN_FREE_GB if value is None else float(value)

    @property
    def ring_ports(self) -> str:
        """The inventory's cluster_ring_ports ('LOW-HIGH'): the supervisors' beats."""
        return str(self.variables.get("cluster_ring_ports") or defaults.RING_PORTS)

    def select(self, nodes: int | None = None, hosts: str | None = None) -> Cluster:
        """`--nodes N` (the first N) or `--hosts a,b` (by name, kept in inventory order)."""
        if nodes is not None and hosts is not None:
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
        elif hosts is not None:
            wanted = [h.strip() for h in hosts.split(",") if h.strip()]
            if not wanted:
                raise InventoryError(
                    f"--hosts {hosts!r} names no node; give inventory names separated by "
                    f"commas, e.g. --hosts {','.join(self.names[:2])}")
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

    def with_user_env(self, name: str | None) -> Cluster:
        """These nodes with the user's own environment NAME (`env create`) instead of the
        cluster's: its files are read from ~/.clustertrain/envs/NAME on every node (None:
        the cluster's environment)."""
        if name is None:
            return self
        check_env_name(name, "--python-env")
        return dataclasses.replace(self, nodes=tuple(
            dataclasses.replace(n, env_state_dir=f"~/{ENVS_DIR}/{name}", python_env=name)
            for n in self.nodes))


def check_env_name(name: str, label: str) -> str:
    """NAME, when it can name a user's own environment (env create --name, train
    --python-env); InventoryError naming LABEL otherwise."""
    if not re.fullmatch(ENV_NAME_PATTERN, name):
        raise InventoryError(f"{label} {name!r}: an environment's name is letters, digits, "
                             "'_', '.' and '-', starting with a letter or digit (64 at most), "
                             "e.g. myproject")
    return name


# Host variables the orchestrator reads; each is rendered by Ansible's templating, and
# one that cannot be rendered (it needs facts, say) is an error naming it and the host.
_SSH_OPTIONS = ("host", "remote_user", "port", "private_key_file",
                "host_key_checking", "ssh_executable", "ssh_args",
                "ssh_common_args", "ssh_extra_args", "timeout")
# A host with ansible_connection: paramiko is reached with the paramiko plugin's settings
# (ours: theirs); the rest (ssh_args...) stays the ssh plugin's, as the command is OpenSSH.
_PARAMIKO_OPTIONS = {"host": "remote_addr", "remote_user": "remote_user", "port": "port",
                     "private_key_file": "private_key_file",
                     "host_key_checking": "host_key_checking", "timeout": "timeout",
                     "proxy_command": "proxy_command"}
# The variables that say where and as whom ssh logs in (the ssh plugin's, the paramiko
# plugin's), each checked as written, before Ansible reads them (True as port 1...).
_HOST_VARS = ("ansible_host", "ansible_ssh_host", "ansible_paramiko_host")
_SSH_PORT = schema.port(1)
_LOGIN_VARS = {**{v: schema.address for v in _HOST_VARS},
               **{v: _SSH_PORT for v in ("ansible_port", "ansible_ssh_port",
                                         "ansible_paramiko_port")},
               **{v: schema.login for v in ("ansible_user", "ansible_ssh_user",
                                            "ansible_paramiko_user")}}


def _load_ansible(path: Path):
    # Imported here so that `--help` and unit tests of other modules stay fast.
    from ansible import constants as C
    from ansible.errors import AnsibleError
    from ansible.inventory import manager
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import connection_loader
    from ansible.vars.manager import VariableManager

    # A file no inventory plugin can parse is an error with the plugins' own reasons
    # (Ansible prints them as warnings), not a warning followed by an empty inventory.
    C.INVENTORY_UNPARSED_IS_FAILED = True
    said: list[str] = []
    warn = manager.display.warning
    manager.display.warning = lambda msg, *a, **kw: said.append(str(msg).strip())
    loader = DataLoader()
    try:
        inventory = InventoryManager(loader=loader, sources=[str(path)])
    except AnsibleError as exc:
        reasons = "\n".join(m for m in said if "Failed to parse" in m) or str(exc)
        raise InventoryError(f"Ansible cannot parse the inventory {path}:\n{reasons}\n"
                             "Fix the file (`ansible-inventory -i FILE --list` shows the "
                             "same error)") from None
    finally:
        manager.display.warning = warn
    for message in said:
        if "Failed to parse" not in message:
            print(f"[WARNING]: {message}", file=sys.stderr)
    connection_loader.get("ssh", class_only=True)  # registers the ssh plugin's options
    return loader, inventory, VariableManager(loader=loader, inventory=inventory)


class _Renderer:
    """Renders one host's variables with Ansible's Templar, one variable at a time."""

    def __init__(self, loader, hostvars: dict[str, Any], host: str, path: Path) -> None:
        from ansible.template import Templar

        self.hostvars, self.host, self.path = hostvars, host, path
        self.templar = Templar(loader=loader, variables=hostvars)

    def get(self, key: str, default: Any = None) -> Any:
        from ansible.errors import AnsibleError

        if key not in self.hostvars:
            return default
        raw = self.hostvars[key]
        try:
            return self.templar.template(raw)
        except AnsibleError as exc:
            first = str(exc).strip().splitlines()[0]
            raise InventoryError(
                f"{self.host}: {key} = {raw!r} in {self.path} cannot be rendered ({first}). "
                "The orchestrator reads the inventory without gathering facts: set "
                f"{key} for {self.host} to a value (an address or a name), not an "
                "expression over facts") from None

    def rendered(self) -> dict[str, Any]:
        """The variables Ansible's ssh options are read from, rendered."""
        keys = [k for k in self.hostvars if k.startswith("ansible_") and
                k not in ("ansible_facts",) and isinstance(self.hostvars[k], str)]
        return {**self.hostvars, **{k: self.get(k) for k in keys if "{{" in self.hostvars[k]
                                    or "{%" in self.hostvars[k]}}


def _target(hv: dict[str, Any], name: str, path: Path) -> SshTarget:
    """How the orchestrator's OpenSSH reaches NAME: the settings of the connection plugin
    the host names (ssh, or paramiko: its user, port, key, host key checking and proxy
    command), with ansible.cfg's ssh_args and the host's ssh_common/extra_args."""
    connection = hv.get("ansible_connection")
    plugin = contract.rules().ssh_plugin(connection)
    if plugin is None:
        raise InventoryError(
            f"{name}: ansible_connection is {connection!r} in {path}, which does not log in "
            "over SSH; the orchestrator starts and watches a training node's processes over "
            "SSH: use ssh (Ansible's default) or paramiko for it")
    if plugin == "paramiko_ssh":
        from ansible.plugins.loader import connection_loader

        connection_loader.get(plugin, class_only=True)  # registers its options
        opts = {mine: _option(plugin, theirs, hv, name, path)
                for mine, theirs in _PARAMIKO_OPTIONS.items()}
    else:
        opts = {}
    for variable, kind in _LOGIN_VARS.items():
        schema.checked(variable, kind, hv.get(variable), path, name)
    opts.update({option: _option("ssh", option, hv, name, path)
                 for option in _SSH_OPTIONS if option not in opts})
    host, user, port = _checked_login(opts, hv, name, path)
    key = opts["private_key_file"]
    return SshTarget(
        host=host, user=user, port=port,
        private_key_file=os.path.expanduser(str(key)) if key else None,
        host_key_checking=bool(opts["host_key_checking"]),
        ssh_executable=str(opts["ssh_executable"] or "ssh"),
        ssh_args=tuple(shlex.split(str(opts["ssh_args"] or ""))),
        common_args=tuple(shlex.split(str(opts["ssh_common_args"] or ""))),
        extra_args=tuple(shlex.split(str(opts["ssh_extra_args"] or ""))),
        timeout=int(opts["timeout"] or 10),
        proxy_command=str(opts.get("proxy_command") or "") or None,
    )


def _checked_login(opts: dict[str, Any], hv: dict[str, Any], name: str, path: Path
                   ) -> tuple[str, str | None, int | None]:
    """The host, user and port ssh is given for NAME, wherever they were set (the
    inventory name, ansible.cfg...), each refused when it is not a plausible one: a host
    ssh would read as an option above all."""
    schema.checked("inventory name", schema.address, name, path, name, "rename the host "
                   "(its ansible_host, if it has one, says where ssh goes)")
    given = next((v for v in _HOST_VARS if hv.get(v) not in (None, "")), "inventory name")
    host = schema.checked(given, schema.address, opts["host"] or name, path, name)
    user = schema.checked("ansible_user", schema.login, opts["remote_user"] or None, path,
                          name)
    port = None if opts["port"] in (None, "") else schema.checked(
        "ansible_port", _SSH_PORT, opts["port"], path, name)
    return host, user, port


def _option(plugin: str, option: str, hv: dict[str, Any], name: str, path: Path) -> Any:
    """The connection plugin PLUGIN's OPTION for a host (Ansible's own precedence:
    ansible.cfg, environment, host variables)."""
    from ansible import constants as C
    from ansible.errors import AnsibleError

    try:
        return C.config.get_config_value(option, plugin_type="connection",
                                         plugin_name=plugin, variables=hv)
    except AnsibleError as exc:
        raise InventoryError(f"{name}: the SSH setting {option} in {path} is not "
                             f"valid: {exc}") from None


def load_cluster(path: str | os.PathLike[str] = defaults.INVENTORY) -> Cluster:
    path = Path(path)
    if not path.exists():
        raise InventoryError(
            f"inventory {path} does not exist; pass the one site.yml uses with "
            "-i/--inventory (a sandbox's is in "
            "~/.local/state/clustertrain/sandboxes/NAME/inventory.yml)")
    loader, inventory, variables = _load_ansible(path)
    group = inventory.groups.get(TRAIN_GROUP)
    hosts = group.get_hosts() if group is not None else []
    if not hosts:
        raise InventoryError(
            f"inventory {path} has no hosts in group '{TRAIN_GROUP}'; list the training "
            "nodes there in order (the first is node 0, see docs/CONVENTIONS.md)")
    _refuse_redefined(path)
    nodes = []
    first: dict[str, Any] = {}
    for host in hosts:
        renderer = _Renderer(loader, variables.get_vars(host=host), host.name, path)
        own = {v.name: schema.check(v, renderer.get(v.name), path,
                                    host.name if v.per_node else "")
               for v in schema.VARIABLES if v.per_node or not first}
        first = first or own
        nodes.append(_node(host.name, renderer, own, path))
    _refuse_duplicates(nodes, path)
    port = first["cluster_rendezvous_port"] or defaults.RENDEZVOUS_PORT
    cluster = Cluster(path, tuple(nodes), first["cluster_shared_path"] or defaults.SHARED_PATH,
                      port, first)
    if not 1 <= cluster.rendezvous_span <= 65536 - port:
        raise InventoryError(f"cluster_rendezvous_port_span in {path}: "
                             f"{first.get('cluster_rendezvous_port_span')!r}: give the number "
                             f"of master ports from {port} up, at least 1, the last at most "
                             "65535 (default 200)")
    return cluster


def _node(name: str, renderer: _Renderer, own: dict[str, Any], path: Path) -> NodeSpec:
    """NAME's node; OWN: its variables of inventory_schema, checked."""
    target = _target(renderer.rendered(), name, path)
    cluster_address = contract.member_address(
        name, {"cluster_address": own["cluster_address"], "ansible_host": target.host})
    interpreter = own["ansible_python_interpreter"] or defaults.NODE_PYTHON
    if "auto" in interpreter:
        interpreter = defaults.NODE_PYTHON
    paths = {variable: own[variable] or _role_path(variable) for variable in _ROLE_PATHS}
    return NodeSpec(name=name, ssh=target, cluster_address=cluster_address,
                    python=interpreter, env_state_dir=paths["python_env_state_dir"],
                    cluster_env_file=paths["common_cluster_env_file"])


def _refuse_duplicates(nodes: list[NodeSpec], path: Path) -> None:
    """Two inventory entries for one machine would start two node ranks on it."""
    for what, key in (("cluster_address", lambda n: n.cluster_address.lower()),
                      ("SSH address", lambda n: (n.ssh.host.lower(), n.ssh.port))):
        seen: dict[Any, str] = {}
        for node in nodes:
            other = seen.setdefault(key(node), node.name)
            if other != node.name:
                raise InventoryError(
                    f"{other} and {node.name} in {path} have the same {what} "
                    f"({node.cluster_address if what == 'cluster_address' else node.ssh.host}); "
                    "each training node must be a different machine: fix ansible_host / "
                    "cluster_address of one of them")


# What makes two lines of an INI inventory two machines under one name.
_ADDRESS_VARS = ("ansible_host", "ansible_port", "cluster_address")


def _ini_host_lines(text: str) -> list[tuple[int, str, dict[str, str]]]:
    """(line number, host, its key=value words) of each host line of an INI inventory
    (the lines of its [group] sections and before the first, not of :vars or :children)."""
    found, hosts = [], True
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            hosts = ":" not in line or line[1:-1].rpartition(":")[2] == "hosts"
            continue
        if not hosts or not line or line.startswith(("#", ";")):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if words:
            found.append((number, words[0], dict(w.split("=", 1) for w in words[1:]
                                                 if "=" in w)))
    return found


def _yaml_host_entries(text: str) -> list[tuple[str, str, dict[str, str]]]:
    """Each host of a YAML inventory as each group gives it: (where: the group's path,
    host, its variables written there); [] for what does not read as one (Ansible's own
    parse says why)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return []
    found: list[tuple[str, str, dict[str, str]]] = []

    def group(where: str, body: Any) -> None:
        if not isinstance(body, dict):
            return
        hosts = body.get("hosts")
        for host, given in (hosts.items() if isinstance(hosts, dict) else []):
            found.append((where, str(host), {str(k): str(v) for k, v in given.items()}
                          if isinstance(given, dict) else {}))
        children = body.get("children")
        for name, child in (children.items() if isinstance(children, dict) else []):
            group(f"{where} > {name}", child)

    for name, body in (data.items() if isinstance(data, dict) else []):
        group(str(name), body)
    return found


def _refuse_redefined(path: Path) -> None:
    """An inventory's host given twice with two addresses (two INI lines, or two YAML
    groups): Ansible keeps one of them, which is not the machine the other names."""
    if not path.is_file() or path.suffix == ".json" or os.access(path, os.X_OK):
        return   # a script's output, or JSON: Ansible's own parse alone
    text = path.read_text(errors="replace")
    if path.suffix in (".yml", ".yaml"):
        _refuse_two_addresses(path, [(f"group {where}", host, given) for where, host, given
                                     in _yaml_host_entries(text)], "Ansible keeps one")
    else:
        _refuse_two_addresses(path, [(f"line {n}", host, given) for n, host, given
                                     in _ini_host_lines(text)], "Ansible keeps the last")


def _refuse_two_addresses(path: Path, entries: list[tuple[str, str, dict[str, str]]],
                          kept: str) -> None:
    """ENTRIES (where, host, its variables there): an InventoryError naming the first host
    given two values of one of _ADDRESS_VARS, both places and the fix."""
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for where, host, words in entries:
        for key in _ADDRESS_VARS:
            if key not in words:
                continue
            first, value = seen.setdefault((host, key), (where, words[key]))
            if value != words[key]:
                raise InventoryError(
                    f"{host} is defined twice in {path} with two addresses: {first} "
                    f"says {key}={value}, {where} says {key}={words[key]} ({kept}); give "
                    f"each machine its own name, or the same {key} in both places")
