"""SSH to a node with paramiko, verifying its host key the way the inventory asks."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from dataclasses import dataclass

import paramiko

from .errors import PreflightError
from .inventory import NodeSpec

CONNECT_TIMEOUT = 10.0


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """StrictHostKeyChecking=accept-new: remember an unknown host's key, and say so."""

    def __init__(self, path: str) -> None:
        self.path = path

    def missing_host_key(self, client, hostname, key) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        print(f"note: added {hostname}'s {key.get_name()} host key to {self.path} "
              "(StrictHostKeyChecking=accept-new)", file=sys.stderr)


def connect(node: NodeSpec, timeout: float = CONNECT_TIMEOUT) -> paramiko.SSHClient:
    """An open SSH connection to NODE; PreflightError naming the node and the fix if not."""
    known = node.known_hosts or os.path.expanduser("~/.ssh/known_hosts")
    client = paramiko.SSHClient()
    if os.path.exists(known):
        client.load_host_keys(known)
    if node.host_key_checking == "no":
        client.set_missing_host_key_policy(paramiko.WarningPolicy())
    elif node.host_key_checking == "accept-new":
        client.set_missing_host_key_policy(_AcceptNewPolicy(known))
    else:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    where = f"{node.user}@{node.host}:{node.port}"
    try:
        client.connect(node.host, port=node.port, username=node.user,
                       key_filename=node.key_file, timeout=timeout, banner_timeout=timeout,
                       auth_timeout=timeout, allow_agent=node.key_file is None,
                       look_for_keys=node.key_file is None)
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise PreflightError(
            f"{node.name}: the host key of {node.host} does not match {known} ({exc}); "
            "if the node was reinstalled, remove its old key with "
            f"`ssh-keygen -R {node.host} -f {known}`") from None
    except paramiko.SSHException as exc:
        client.close()
        if "not found in known_hosts" in str(exc):
            raise PreflightError(
                f"{node.name}: {node.host} is not in {known} and host keys are checked; "
                f"add it with `ssh-keyscan -p {node.port} {node.host} >> {known}` after "
                "checking its fingerprint") from None
        raise PreflightError(f"{node.name}: SSH to {where} failed: {exc}; check "
                             "ansible_user / ansible_ssh_private_key_file in the inventory") from None
    except (OSError, socket.timeout) as exc:
        client.close()
        raise PreflightError(f"{node.name}: cannot reach {where} ({exc}); is the node up "
                             "and ansible_host/ansible_port right in the inventory?") from None
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(5)
    return client


@dataclass(frozen=True)
class Result:
    exit_code: int
    stdout: str
    stderr: str


def run(client: paramiko.SSHClient, command: str, timeout: float = 60.0,
        stdin: str | None = None) -> Result:
    """Run COMMAND on the node; wait for it; return its exit code and output."""
    chan = client.get_transport().open_session(timeout=timeout)  # type: ignore[union-attr]
    chan.settimeout(timeout)
    chan.exec_command(command)
    if stdin is not None:
        chan.sendall(stdin.encode())
        chan.shutdown_write()
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"`{command[:60]}...` did not finish within {timeout:.0f} s")
            if chan.recv_ready():
                out += chan.recv(65536)
            elif chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            elif chan.exit_status_ready():
                break
            else:
                chan.status_event.wait(0.05)  # set when the command exits
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        code = chan.recv_exit_status()
    finally:
        chan.close()
    return Result(code, out.decode(errors="replace"), err.decode(errors="replace"))


def alive(client: paramiko.SSHClient, timeout: float = 3.0) -> bool:
    """True if the node answers an SSH keepalive request within TIMEOUT seconds.

    paramiko's own keepalive only sends; this waits for the answer, like OpenSSH's
    ServerAliveCountMax, so that a node that vanished (no TCP reset) is noticed.
    """
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        return False
    answered = threading.Event()

    def ask() -> None:
        try:
            transport.global_request("keepalive@openssh.com", wait=True)
        except Exception:  # noqa: BLE001 - a dead transport is the answer we look for
            return
        if transport.is_active():
            answered.set()

    threading.Thread(target=ask, daemon=True).start()
    return answered.wait(timeout)
