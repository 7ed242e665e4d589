"""Bring a sandbox cluster up, report on it, take it down again.

Everything a sandbox creates carries the label clustertrain.sandbox=NAME, and `down`
removes exactly the labelled containers, the network NAME and the state directory.

The nodes log in like a real site's servers: by name through STATE/ssh_config, as alice
(sudo) or bob (no sudo), never as root; they resolve each other by name through the
network's DNS; with a bastion, SSH from the host reaches them only through it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..errors import SandboxError
from . import share
from .image import ensure_image
from .layout import (
    ADMIN_USER,
    BASTION_TABLE,
    EXPORT_PATH,
    LABEL,
    SHARED_PATH,
    USERS,
    Node,
    SandboxSpec,
    default_gateway,
    describe,
    render_inventory,
    render_ssh_config,
    sandbox_vars,
    state_root,
    validate_name,
    validate_users,
)
from .limits import check_host
from .podman import podman, podman_json

BOOT_TIMEOUT = 60.0


def _containers(name: str) -> list[dict]:
    """podman's view of the containers that carry this sandbox's label."""
    return podman_json(["ps", "-a", "--filter", f"label={LABEL}={name}", "--format", "json"])


def _existing(name: str) -> list[str]:
    """What already carries this sandbox's name: containers, the network, the state dir."""
    found = [c["Names"][0] for c in _containers(name)]
    if podman(["network", "exists", name], check=False).returncode == 0:
        found.append(f"network {name}")
    if (state_root() / name).exists():
        found.append(f"state directory {state_root() / name}")
    return found


def _write_key(spec: SandboxSpec) -> str:
    key = Ed25519PrivateKey.generate()
    spec.key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption()))
    spec.key_path.chmod(0o600)
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                        serialization.PublicFormat.OpenSSH).decode()
    pub += f" clustertrain-sandbox-{spec.name}\n"
    spec.key_path.with_suffix(".pub").write_text(pub)
    return pub


def _run_container(spec: SandboxSpec, node: Node, image: str) -> None:
    pub = spec.key_path.with_suffix(".pub")
    args = ["run", "-d", "--name", node.container, "--hostname", node.name,
            "--label", f"{LABEL}={spec.name}", "--network", spec.name, "--ip", node.address,
            # The other containers resolve it by its short name (the network's DNS).
            "--network-alias", node.name,
            "--systemd=always",
            # root's key too: that root cannot log in is then sshd's doing (PermitRootLogin).
            "-v", f"{pub}:/root/.ssh/authorized_keys:ro"]
    # The image's users (image.py); the extra researchers get theirs in _add_users.
    args += [a for u in USERS for a in ("-v", f"{pub}:/home/{u.name}/.ssh/authorized_keys:ro")]
    if node != spec.bastion_node():
        # nftables in the node's own network namespace; nfs-ganesha's file handles.
        args += ["--cap-add", "NET_ADMIN", "--cap-add", "DAC_READ_SEARCH"]
    if node in spec.members() and not node.outsider:
        # The kernel here has no NFS client: the sandbox provides the shared directory at
        # the export path for the server, and at the mount point through a FUSE daemon of
        # the node's own (share.py: it can stall as an NFS mount does).
        args += ["-v", f"{spec.share_dir}:{EXPORT_PATH}",
                 "-v", f"{share.mount(spec, node.name)}:{SHARED_PATH}"]
    podman([*args, image, "/sbin/init"])


def bastion_ruleset(spec: SandboxSpec) -> str:
    """nftables rules (in a node's own network namespace) that drop SSH from the host:
    the host reaches the nodes only through the bastion."""
    return (f"table inet {BASTION_TABLE}\n"
            f"delete table inet {BASTION_TABLE}\n"
            f"table inet {BASTION_TABLE} {{\n"
            "  chain input {\n"
            "    type filter hook input priority filter - 10; policy accept;\n"
            f"    ip saddr {spec.gateway} tcp dport 22 counter drop"
            " comment \"sandbox --bastion: SSH from the host only through the bastion\"\n"
            "  }\n"
            "}\n")


def add_users_script(spec: SandboxSpec) -> str:
    """Shell (run as root in a container) that makes the sandbox's extra researchers as
    the image makes bob: a login user with the same uid and gid on every container, a
    private home, the sandbox's key authorized, no sudo. It is idempotent: a container
    started again keeps its users."""
    out = ["set -eu"]
    for u in spec.users[len(USERS):]:
        home = f"/home/{u.name}"
        out.append(
            f"getent group {u.name} >/dev/null || groupadd -g {u.uid} {u.name}\n"
            f"id -u {u.name} >/dev/null 2>&1 || useradd -u {u.uid} -g {u.uid} -m -s /bin/bash "
            f"-p '*' {u.name}\n"
            f"chmod 0700 {home}\n"
            f"install -d -m 0700 -o {u.uid} -g {u.uid} {home}/.ssh\n"
            f"install -m 0600 -o {u.uid} -g {u.uid} /run/sandbox-key.pub "
            f"{home}/.ssh/authorized_keys")
    return "\n".join(out) + "\n"


def _add_users(spec: SandboxSpec, node: Node) -> None:
    """The extra researchers (`--users`) on NODE, with the sandbox's public key."""
    if not spec.extra_users:
        return
    pub = spec.key_path.with_suffix(".pub").read_text()
    podman(["exec", "-i", node.container, "sh", "-c",
            f"cat > /run/sandbox-key.pub && sh -c {shlex.quote(add_users_script(spec))}"],
           input=pub.encode())


def _close_to_host(spec: SandboxSpec, node: Node) -> None:
    """Bastion mode: load the rules by the node's sandbox-bastion.service (it reloads
    them at boot and after any nftables.service flush)."""
    podman(["exec", "-i", node.container, "sh", "-c",
            "cat > /etc/sandbox-bastion.nft && systemctl restart sandbox-bastion.service"],
           input=bastion_ruleset(spec).encode())


def _wait_booted(node: Node, deadline: float) -> None:
    while True:
        left = deadline - time.monotonic()
        proc = podman(["exec", node.container, "systemctl", "is-system-running", "--wait"],
                      check=False, timeout=max(left, 1))
        state = proc.stdout.strip()
        if state == "running":
            return
        if state == "degraded":
            failed = podman(["exec", node.container, "systemctl", "--failed", "--no-legend"],
                            check=False).stdout.strip()
            raise SandboxError(
                f"{node.container}: systemd booted 'degraded'; failed units:\n{failed}")
        if time.monotonic() > deadline:
            raise SandboxError(f"{node.container}: systemd did not reach 'running' within "
                               f"{BOOT_TIMEOUT:.0f} s (state: {state or proc.stderr.strip()})")
        time.sleep(0.5)


def _host_key(node: Node, deadline: float) -> str:
    while True:
        proc = podman(["exec", node.container, "cat", "/etc/ssh/ssh_host_ed25519_key.pub"],
                      check=False)
        if proc.returncode == 0:
            return " ".join(proc.stdout.split()[:2])
        if time.monotonic() > deadline:
            raise SandboxError(f"{node.container}: sshd host key was not generated")
        time.sleep(0.5)


def ssh_command(spec: SandboxSpec, node: Node | str, *command: str,
                user: str = ADMIN_USER.name, timeout: float = 10) -> list[str]:
    """The OpenSSH command line that runs COMMAND on NODE as USER through the sandbox's
    ssh_config (host keys checked, through the bastion in bastion mode)."""
    ssh = shutil.which("ssh")
    if ssh is None:
        raise SandboxError("the OpenSSH client (ssh) is not installed; the sandbox's nodes are "
                           "reached with it.\nInstall it with: sudo apt-get install -y "
                           "openssh-client")
    name = node if isinstance(node, str) else node.name
    return [ssh, "-F", str(spec.ssh_config_for(user)), "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(int(timeout), 1)}", name, *command]


def ssh_run(spec: SandboxSpec, node: Node | str, *command: str, user: str = ADMIN_USER.name,
            timeout: float = 10) -> subprocess.CompletedProcess[str]:
    """Run COMMAND on NODE over real SSH as USER; ssh's own failure (exit 255) is an error."""
    cmd = ssh_command(spec, node, *command, user=user, timeout=timeout)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=timeout * 3)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"`{' '.join(cmd)}` did not finish within {timeout * 3:.0f} s") from None
    if proc.returncode == 255:
        raise SandboxError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")
    return proc


def ssh_check(spec: SandboxSpec, node: Node, timeout: float = 10,
              user: str = ADMIN_USER.name) -> str:
    """Log in over real SSH (OpenSSH with the sandbox's ssh_config, as alice unless USER
    says otherwise); return `systemctl is-system-running`."""
    return ssh_run(spec, node, "systemctl", "is-system-running", user=user,
                   timeout=timeout).stdout.strip()


def up(name: str, nodes: int, outsiders: int = 0, log=print, bastion: bool = False,
       slurm: bool = False, users: tuple[str, ...] = ()) -> SandboxSpec:
    """Make the sandbox NAME; USERS: researchers to add to the image's alice and bob."""
    validate_name(name)
    validate_users(users)
    taken = _existing(name)
    if taken:
        raise SandboxError(
            f"sandbox name {name!r} is already in use ({', '.join(taken)}).\n"
            f"Remove it with `python -m orchestrator sandbox down --name {name}` "
            "or choose another --name.")
    check_host(nodes + outsiders + (1 if bastion else 0))
    share.check_tools()
    spec = SandboxSpec(name=name, nodes=nodes, outsiders=outsiders, bastion=bastion,
                       slurm=slurm, extra_users=tuple(users))
    image = ensure_image(state_root().parent / "images", log=log)
    try:
        spec.state_dir.mkdir(parents=True)
        spec.share_dir.mkdir()
        _write_key(spec)
        # The network's own DNS (aardvark) lets the containers resolve each other by name.
        podman(["network", "create", "--label", f"{LABEL}={name}", name])
        net = podman_json(["network", "inspect", name])[0]
        if not net.get("dns_enabled"):
            raise SandboxError(f"podman created network {name!r} without DNS; the nodes resolve "
                               "each other through it (is aardvark-dns installed? "
                               "sudo apt-get install -y aardvark-dns)")
        spec.subnet = net["subnets"][0]["subnet"]
        spec.gateway = net["subnets"][0].get("gateway") or default_gateway(spec.subnet)
        containers = spec.containers()
        for node in containers:
            _run_container(spec, node, image)
        deadline = time.monotonic() + BOOT_TIMEOUT
        known = []
        for node in containers:
            _wait_booted(node, deadline)
            known.append(f"{node.address} {_host_key(node, deadline)}")
            _add_users(spec, node)
        spec.known_hosts.write_text("\n".join(known) + "\n")
        for user in spec.users:
            spec.ssh_config_for(user.name).write_text(render_ssh_config(spec, user.name))
        if spec.bastion:
            for node in spec.members():
                _close_to_host(spec, node)
        for node in containers:
            _wait_ssh(spec, node, deadline)
        for user in spec.users:
            spec.inventory_for(user.name).write_text(
                render_inventory(spec, sandbox_vars(), user=user.name))
        (spec.state_dir / "sandbox.json").write_text(json.dumps(
            {"name": name, "nodes": nodes, "outsiders": outsiders, "subnet": spec.subnet,
             "gateway": spec.gateway, "bastion": bastion, "slurm": slurm,
             "users": list(spec.extra_users)}))
    except BaseException:
        down(name, log=lambda *_: None)
        raise
    return spec


def _wait_ssh(spec: SandboxSpec, node: Node, deadline: float) -> None:
    while True:
        try:
            state = ssh_check(spec, node)
            if state == "running":
                return
            error = f"systemd state {state!r}"
        except SandboxError as exc:
            error = str(exc)
        if time.monotonic() > deadline:
            raise SandboxError(f"{node.container}: no SSH login as {ADMIN_USER.name} at "
                               f"{node.address} with the sandbox key ({error})")
        time.sleep(0.5)


def load(name: str) -> SandboxSpec:
    validate_name(name)
    meta = state_root() / name / "sandbox.json"
    if not meta.exists():
        raise SandboxError(f"no sandbox named {name!r} (nothing at {meta.parent}); "
                           f"create it with `python -m orchestrator sandbox up --name {name}`")
    data = json.loads(meta.read_text())
    return SandboxSpec(name=data["name"], nodes=data["nodes"], outsiders=data["outsiders"],
                       subnet=data["subnet"], gateway=data.get("gateway", ""),
                       bastion=data.get("bastion", False), slurm=data.get("slurm", False),
                       extra_users=tuple(data.get("users") or ()))


def status(name: str) -> dict:
    spec = load(name)
    states = {c["Names"][0]: c["State"] for c in _containers(name)}
    return describe(spec, states)


def down(name: str, log=print) -> list[str]:
    """Remove exactly what `up` created for NAME; return what was removed."""
    validate_name(name)
    removed = []
    containers = [c["Names"][0] for c in _containers(name)]
    if containers:
        podman(["rm", "-f", "-t", "0", *containers], timeout=300)
        removed += containers
    if podman(["network", "exists", name], check=False).returncode == 0:
        labels = podman_json(["network", "inspect", name])[0].get("labels") or {}
        if labels.get(LABEL) != name:
            raise SandboxError(f"network {name!r} was not created by this sandbox "
                               "(it lacks the sandbox label); it was left alone")
        podman(["network", "rm", name])
        removed.append(f"network {name}")
    state_dir = state_root() / name
    if state_dir.exists():
        if share.unmount(state_dir):
            removed.append("the share's FUSE mounts")
        shutil.rmtree(state_dir)
        removed.append(f"state directory {state_dir}")
    log(f"sandbox {name}: removed {', '.join(removed)}" if removed
        else f"sandbox {name}: nothing to remove")
    return removed


def list_names() -> list[str]:
    root = state_root()
    return sorted(p.name for p in root.iterdir() if (p / "sandbox.json").exists()) \
        if root.exists() else []
