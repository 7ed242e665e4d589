"""Bring a sandbox cluster up, report on it, take it down again.

Everything a sandbox creates carries the label clustertrain.sandbox=NAME, and `down`
removes exactly the labelled containers, the network NAME and the state directory.
"""

from __future__ import annotations

import json
import shutil
import time

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..errors import SandboxError
from ..podman import podman, podman_json
from .image import ensure_image
from .spec import (EXPORT_PATH, LABEL, SHARED_PATH, Node, SandboxSpec, describe,
                   render_inventory, sandbox_vars, state_root, validate_name)

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
    args = ["run", "-d", "--name", node.container, "--hostname", node.name,
            "--label", f"{LABEL}={spec.name}", "--network", spec.name, "--ip", node.address,
            "--systemd=always",
            # nftables in the node's own network namespace; nfs-ganesha's file handles.
            "--cap-add", "NET_ADMIN", "--cap-add", "DAC_READ_SEARCH",
            "-v", f"{spec.key_path.with_suffix('.pub')}:/root/.ssh/authorized_keys:ro"]
    if not node.outsider:
        # The kernel here has no NFS client: the sandbox provides the shared
        # directory at the mount point itself, and at the export path for the server.
        args += ["-v", f"{spec.share_dir}:{EXPORT_PATH}", "-v", f"{spec.share_dir}:{SHARED_PATH}"]
    podman([*args, image, "/sbin/init"])


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
            raise SandboxError(f"{node.container}: systemd booted 'degraded'; failed units:\n{failed}")
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


def ssh_check(spec: SandboxSpec, node: Node, timeout: float = 10) -> str:
    """Log in over real SSH with the sandbox key; return `systemctl is-system-running`."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(spec.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(node.address, username="root", key_filename=str(spec.key_path),
                       timeout=timeout, allow_agent=False, look_for_keys=False)
        _, out, _ = client.exec_command("systemctl is-system-running", timeout=timeout)
        return out.read().decode().strip()
    finally:
        client.close()


def up(name: str, nodes: int, outsiders: int = 0, log=print) -> SandboxSpec:
    validate_name(name)
    taken = _existing(name)
    if taken:
        raise SandboxError(
            f"sandbox name {name!r} is already in use ({', '.join(taken)}).\n"
            f"Remove it with `python -m orchestrator sandbox down --name {name}` "
            "or choose another --name.")
    spec = SandboxSpec(name=name, nodes=nodes, outsiders=outsiders)
    image = ensure_image(state_root().parent / "images", log=log)
    try:
        spec.state_dir.mkdir(parents=True)
        spec.share_dir.mkdir()
        _write_key(spec)
        podman(["network", "create", "--label", f"{LABEL}={name}", name])
        net = podman_json(["network", "inspect", name])[0]
        spec.subnet = net["subnets"][0]["subnet"]
        members = spec.members()
        for node in members:
            _run_container(spec, node, image)
        deadline = time.monotonic() + BOOT_TIMEOUT
        known = []
        for node in members:
            _wait_booted(node, deadline)
            known.append(f"{node.address} {_host_key(node, deadline)}")
        spec.known_hosts.write_text("\n".join(known) + "\n")
        for node in members:
            _wait_ssh(spec, node, deadline)
        spec.inventory_path.write_text(render_inventory(spec, sandbox_vars()))
        (spec.state_dir / "sandbox.json").write_text(json.dumps(
            {"name": name, "nodes": nodes, "outsiders": outsiders, "subnet": spec.subnet}))
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
        except (OSError, paramiko.SSHException) as exc:
            error = str(exc)
        if time.monotonic() > deadline:
            raise SandboxError(f"{node.container}: no SSH login at {node.address} with the "
                               f"sandbox key ({error})")
        time.sleep(0.5)


def load(name: str) -> SandboxSpec:
    validate_name(name)
    meta = state_root() / name / "sandbox.json"
    if not meta.exists():
        raise SandboxError(f"no sandbox named {name!r} (nothing at {meta.parent}); "
                           f"create it with `python -m orchestrator sandbox up --name {name}`")
    data = json.loads(meta.read_text())
    return SandboxSpec(name=data["name"], nodes=data["nodes"], outsiders=data["outsiders"],
                       subnet=data["subnet"])


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
        shutil.rmtree(state_dir)
        removed.append(f"state directory {state_dir}")
    log(f"sandbox {name}: removed {', '.join(removed)}" if removed
        else f"sandbox {name}: nothing to remove")
    return removed


def list_names() -> list[str]:
    root = state_root()
    return sorted(p.name for p in root.iterdir() if (p / "sandbox.json").exists()) \
        if root.exists() else []
