"""SSH to the nodes with the OpenSSH client, exactly as Ansible's ssh connection does.

The options come from Ansible itself (see inventory.SshTarget): ansible.cfg's
`ssh_args`, `remote_user`, `private_key_file`, `host_key_checking`, and the host's
`ansible_ssh_common_args` / `ansible_ssh_extra_args`; the client reads `~/.ssh/config`
(Host aliases, ProxyJump, IdentityFile...) and the known_hosts files on its own. So a
node that `ansible-playbook` reaches is reached here the same way, bastions included.

One master connection per node (ControlMaster, in a private socket directory) carries
every later command: a session over it starts in milliseconds. The master sends
ServerAlive probes; a node that stops answering them ends its master and every session
over it, which is how a lost node is noticed (run/job.py then takes a second look: a
new connection, before the node is named lost).
"""

from __future__ import annotations

import copy
import ctypes
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from ..errors import InventoryError, PreflightError
from .fanout import each

CONNECT_TIMEOUT = 10
# The master's liveness probes: a node that misses this many in a row is lost.
ALIVE_INTERVAL = 2
ALIVE_COUNT = 4
# An idle master (no session for this long) exits by itself: nothing outlives a
# controller killed with SIGKILL for long.
MASTER_PERSIST = 60
# The server (or a bastion on the way) dropped the connection before the login: what an
# sshd does beyond MaxStartups (default 10:30:100) when many nodes connect at once. Said
# as "kex_exchange_identification: ..." by the server dropping it, or as "banner exchange:
# ... Broken pipe" when a bastion on the way (ProxyJump) dropped the jump.
DROPPED = re.compile(r"kex_exchange_identification|banner exchange")
# A jump host (ProxyJump) that could not reach the node: OpenSSH's words for the jump's
# channel, before the same closed connection as a drop. The node is down or cut off.
UNREACHED = re.compile(r"channel \d+: open failed: (?:connect failed: )?(?P<why>[^\n]+)")
DROPPED_RETRIES = 5
DROPPED_PAUSE_MAX = 8.0   # seconds: the longest pause between two tries
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class SshTarget:
    """How to reach one node, resolved with Ansible's own configuration and precedence."""

    host: str                                # ansible_host, else the inventory name
    user: str | None = None                  # remote_user / ansible_user; None: ssh decides
    port: int | None = None                  # None: ssh decides (~/.ssh/config, 22)
    private_key_file: str | None = None
    host_key_checking: bool = True
    ssh_executable: str = "ssh"
    ssh_args: tuple[str, ...] = ()           # ansible.cfg [ssh_connection] ssh_args
    common_args: tuple[str, ...] = ()        # ansible_ssh_common_args
    extra_args: tuple[str, ...] = ()         # ansible_ssh_extra_args
    timeout: int = CONNECT_TIMEOUT
    proxy_command: str | None = None         # ansible_paramiko_proxy_command (%h %p %r)

    def __post_init__(self) -> None:
        # The inventory refuses such a host (inventory_schema.address); this is the last
        # line: a host OpenSSH would take for an option (-oProxyCommand=...) or for words.
        if not self.host or self.host.startswith("-") or any(
                c.isspace() or ord(c) < 32 for c in self.host):
            raise InventoryError(
                f"SSH host {self.host!r} would be read by ssh as an option or as words; "
                "give a host name or an IP address (ansible_host in the inventory)")

    def at(self, *command: str) -> list[str]:
        """The end of an ssh command line: the host, then COMMAND to run there. After
        `--`, so that nothing in it is read as an option."""
        return ["--", self.host, *command]

    def options(self) -> list[str]:
        """The arguments Ansible's ssh plugin gives, in its order (the first value of an
        option wins in OpenSSH, so the order matters)."""
        argv = list(self.ssh_args)
        if not self.host_key_checking:
            argv += ["-o", "StrictHostKeyChecking=no"]
        if self.port:
            argv += ["-o", f"Port={self.port}"]
        if self.private_key_file:
            argv += ["-o", f"IdentityFile={self.private_key_file}"]
        argv += ["-o", "KbdInteractiveAuthentication=no",
                 "-o", "PreferredAuthentications=gssapi-with-mic,gssapi-keyex,hostbased,publickey",
                 "-o", "PasswordAuthentication=no"]
        if self.user:
            argv += ["-o", f"User={self.user}"]
        if self.proxy_command:   # paramiko's tokens are OpenSSH's: %h, %p, %r
            argv += ["-o", f"ProxyCommand={self.proxy_command}"]
        argv += ["-o", f"ConnectTimeout={self.timeout}", *self.common_args, *self.extra_args]
        return argv

    def effective(self) -> dict[str, str]:
        """OpenSSH's resolved settings for this node (`ssh -G`: ~/.ssh/config applied,
        nothing connected): user, hostname, port, proxyjump..."""
        proc = subprocess.run([self.ssh_executable, "-G", *self.options(), *self.at()],
                              capture_output=True, text=True, timeout=10)
        settings: dict[str, str] = {}
        for line in proc.stdout.splitlines():
            key, _, value = line.partition(" ")
            settings.setdefault(key, value)
        return settings

    def effective_user(self) -> str:
        return self.effective().get("user") or self.user or ""

    @property
    def display(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}" + \
            (f":{self.port}" if self.port else "")


@dataclass(frozen=True)
class Result:
    exit_code: int
    stdout: str
    stderr: str


class Connection:
    """An open master connection to one node; `run`, `popen` and `alive` use it."""

    def __init__(self, name: str, target: SshTarget) -> None:
        self.name = name
        self.target = target
        # A short private directory: socket paths are limited to 108 bytes.
        self._dir = tempfile.mkdtemp(prefix="ct-ssh-", dir="/tmp")
        self.control_path = os.path.join(self._dir, "m")
        self._master_pid: int | None = None
        self._pid_asked = False
        self.owned = True   # close() ends the master; not for a borrowed() one

    @property
    def master_pid(self) -> int | None:
        """The master's pid, asked of it (`ssh -O check`) once, when first needed: a
        connection that only runs commands (preflight's) never asks, one process fewer
        per node."""
        if not self._pid_asked and os.path.exists(self.control_path):
            self._pid_asked = True
            check = subprocess.run([self.target.ssh_executable, "-o",
                                    f"ControlPath={self.control_path}", "-O", "check",
                                    *self.target.at()], capture_output=True, text=True,
                                   timeout=10, check=False)
            found = re.search(r"pid=(\d+)", check.stderr + check.stdout)
            self._master_pid = int(found.group(1)) if found else None
        return self._master_pid

    def _argv(self, ours: list[str], *rest: str) -> list[str]:
        # Ours first: they must win over ansible.cfg's ControlMaster/ControlPath. The
        # host and the remote command come last (SshTarget.at).
        return [self.target.ssh_executable, "-o", f"ControlPath={self.control_path}",
                "-o", "BatchMode=yes", *ours, *self.target.options(), *rest]

    def open(self, within: float | None = None) -> Connection:
        """Connect (the master); with WITHIN, give up after that many seconds in all."""
        argv = self._argv(["-o", "ControlMaster=yes", "-o", f"ControlPersist={MASTER_PERSIST}",
                           "-o", f"ServerAliveInterval={ALIVE_INTERVAL}",
                           "-o", f"ServerAliveCountMax={ALIVE_COUNT}", "-f", "-N"],
                          *self.target.at())
        each = self.target.timeout * 3 + 10   # seconds an attempt may take
        deadline = None if within is None else time.monotonic() + within

        def limit() -> float:
            return each if deadline is None else max(0.1, min(each, deadline - time.monotonic()))

        try:
            for attempt in range(DROPPED_RETRIES + 1):
                proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                      text=True, timeout=limit())
                stderr = proc.stderr
                if proc.returncode == 255 and attempt == 0:
                    stderr += self._proxy_said(limit())
                if proc.returncode != 255 or not DROPPED.search(stderr) or refused(stderr) \
                        or UNREACHED.search(stderr):
                    break
                # Dropped before the login: again after a pause that grows, spread so
                # that the nodes do not all come back at once. (Any other failure, a
                # refused key or a node down, is reported at once.)
                if deadline is not None and time.monotonic() > deadline:
                    break
                time.sleep(min(DROPPED_PAUSE_MAX, random.uniform(0.5, 1.0) * 2 ** attempt))
        except FileNotFoundError:
            self.close()
            raise PreflightError(
                f"{self.name}: the OpenSSH client {self.target.ssh_executable!r} is not "
                "installed; install openssh-client (it is what Ansible uses too)") from None
        except subprocess.TimeoutExpired:
            self.close()
            raise PreflightError(f"{self.name}: SSH to {self.target.display} did not "
                                 "answer; is the node up?") from None
        if proc.returncode != 0:
            self.close()
            raise PreflightError(explain(self.name, self.target, stderr))
        self._pid_asked = False   # asked when needed (master_pid)
        return self

    def _proxy_said(self, timeout: float) -> str:
        """What a ProxyJump/ProxyCommand said when the master failed: a master with
        ControlPersist sends the proxy's messages to /dev/null, so that a key the bastion
        refused shows only as a closed connection. Asked again without a master."""
        argv = alone(self.target, *self.target.at("exit"))
        try:
            return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=timeout).stderr
        except (OSError, subprocess.TimeoutExpired):
            return ""

    def shell(self) -> list[str]:
        """argv of an SSH command over the master, without the host and what to run
        (a remote shell for rsync's --rsh)."""
        return self._argv(["-o", "ControlMaster=no"])

    def command(self, command: str) -> list[str]:
        """argv that runs COMMAND (one shell string) on the node over the master."""
        return [*self.shell(), *self.target.at(command)]

    def run(self, command: str, timeout: float = 60.0, stdin: str | None = None) -> Result:
        """Run COMMAND on the node; wait for it; return its exit code and output."""
        try:
            proc = subprocess.run(self.command(command), input=stdin if stdin is not None
                                  else "", capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.name}: `{command[:60]}...` did not finish within "
                               f"{timeout:.0f} s") from None
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def popen(self, command: str, stdin: bool = False) -> subprocess.Popen:
        """Start COMMAND on the node; its stdout and stderr come back merged, as bytes.
        With STDIN, a pipe to the command's standard input (closed when this process
        ends, however it ends: the node sees end-of-input)."""
        return subprocess.Popen(self.command(command),
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def alive(self) -> bool:
        """False once the master connection has ended (the node stopped answering)."""
        if self.master_pid is None:
            return os.path.exists(self.control_path)
        try:
            os.kill(self.master_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def borrowed(self) -> Connection:
        """This master connection for a second user of it, whose close() leaves it open:
        its owner (this object) ends it."""
        other = copy.copy(self)
        other.owned = False
        return other

    def close(self) -> None:
        if not self.owned:
            return
        told = False
        if os.path.exists(self.control_path):
            try:
                told = subprocess.run([self.target.ssh_executable, "-o",
                                       f"ControlPath={self.control_path}", "-O", "exit",
                                       *self.target.at()], capture_output=True, timeout=10,
                                      check=False).returncode == 0
            except subprocess.TimeoutExpired:
                pass
        pid = self._master_pid if told else self.master_pid
        if pid is not None:   # known, or it did not take the word: ended for sure
            try:
                os.kill(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        self._master_pid, self._pid_asked = None, True
        shutil.rmtree(self._dir, ignore_errors=True)


def alone(target: SshTarget, *rest: str, ours: tuple[str, ...] = ()) -> list[str]:
    """argv of an SSH connection of its own to TARGET (no master shared, none left behind),
    with OURS before the node's options (the first value of an option wins), then REST
    (TARGET.at(...): the host and the command; none for rsync's --rsh)."""
    return [target.ssh_executable, "-o", "BatchMode=yes", "-o", "ControlMaster=no",
            "-o", "ControlPath=none", "-o", "ControlPersist=no", *ours, *target.options(),
            *rest]


def forward(target: SshTarget, local: int | str, remote_port: int) -> subprocess.Popen:
    """A tunnel: LOCAL here (a port of 127.0.0.1, or the path of a Unix socket, which ssh
    makes: in a private directory only its user can open it) to 127.0.0.1:REMOTE_PORT on
    the node, over a connection of its own (bastions and ~/.ssh/config as for every
    connection), open while the process lives. ssh exits when the forward cannot be made
    (the local end taken) or the node stops answering; its words are on the process's
    stderr. It ends with the thread that opened it, however that ends (kill -9 included)."""
    here = f"127.0.0.1:{local}" if isinstance(local, int) else local
    return subprocess.Popen(
        alone(target, *target.at(), ours=(
            "-N", "-o", "ExitOnForwardFailure=yes",
            "-o", f"ServerAliveInterval={ALIVE_INTERVAL}",
            "-o", f"ServerAliveCountMax={ALIVE_COUNT}",
            "-L", f"{here}:127.0.0.1:{remote_port}")),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True, preexec_fn=_end_with_parent)


def _end_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that started it ends (Linux's
    PR_SET_PDEATHSIG), so that no tunnel outlives the command that opened it."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


# What OpenSSH says of a private key it cannot use, and of a login it refused. Through a
# ProxyJump the refusal is the bastion's, followed by lines that look like a dropped
# connection ("kex_exchange_identification"): these are not retried.
MISSING_KEY = re.compile(r"(?:no such identity:|Identity file) (\S+?):? (?:not accessible: )?"
                         r"No such file or directory")
OPEN_KEY = re.compile(r"Permissions (\d+) for '([^']+)' are too open")
DENIED = re.compile(r"(\S+): Permission denied \(([^)]*)\)")


def refused(stderr: str) -> bool:
    """The login was refused (a key ssh could not use, or the server said no): trying
    again cannot help."""
    return bool(MISSING_KEY.search(stderr) or OPEN_KEY.search(stderr)
                or DENIED.search(stderr))


def explain(name: str, target: SshTarget, stderr: str) -> str:
    """A message that names the node, what OpenSSH said, and the likely fix."""
    lines = [line for line in stderr.strip().splitlines()
             if line.strip() and not line.startswith(("Warning: Permanently added", "@@@"))]
    said = lines[-1] if lines else "no message"
    where = target.display
    missing, loose, denied = MISSING_KEY.search(stderr), OPEN_KEY.search(stderr), \
        DENIED.search(stderr)
    at = f" (refused by {denied.group(1)})" if denied else ""
    if missing:
        return (f"{name}: SSH to {where} cannot log in{at}: the private key {missing.group(1)} "
                "does not exist. Point ansible_ssh_private_key_file (or IdentityFile in your "
                "SSH config) at your key, or create it (ssh-keygen) and install its .pub on "
                "the nodes")
    if loose:
        return (f"{name}: SSH to {where} cannot log in{at}: the private key {loose.group(2)} has "
                f"mode {loose.group(1)}, readable by other users, so ssh ignores it. Make it "
                f"private: chmod 600 {loose.group(2)}")
    if "Permission denied" in stderr:
        return (f"{name}: SSH login as {target.user or 'the default user'} at {where} was "
                f"refused ({said}); check that the user exists on the node and that "
                "ansible_user and the key (ansible_ssh_private_key_file, or IdentityFile in "
                "~/.ssh/config) are right")
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr:
        return (f"{name}: the host key of {target.host} does not match the one in "
                "known_hosts; if the node was reinstalled, remove the old key with "
                f"`ssh-keygen -R {target.host}` (and the same for its address)")
    if "Host key verification failed" in stderr or "No " in said and "host key is known" in said:
        return (f"{name}: {target.host}'s host key is not known and host keys are checked; "
                f"check its fingerprint, then add it with `ssh-keyscan {target.host} >> "
                "~/.ssh/known_hosts` (or the UserKnownHostsFile your SSH options name)")
    unreached = UNREACHED.search(stderr)
    if unreached:
        return (f"{name}: the jump host on the way to {where} cannot reach it "
                f"({unreached.group('why').strip()}): is the node up, and on the network? "
                "Check it from the jump host (ssh to it, then ping the node)")
    if DROPPED.search(stderr):
        return (f"{name}: the connection to {where} was dropped before the login, "
                f"{DROPPED_RETRIES + 1} times ({said}): an SSH server on the way (the node's, "
                "or the bastion's) refuses this many connections at once (sshd's MaxStartups, "
                "default 10:30:100); raise MaxStartups there, or keep one master connection "
                "to the bastion (ControlMaster auto and ControlPersist in its ~/.ssh/config "
                "block)")
    if "Could not resolve hostname" in stderr:
        return (f"{name}: cannot resolve {target.host} ({said}); fix ansible_host in the "
                "inventory or the Host entry in your SSH config")
    return (f"{name}: cannot reach {where} ({said}); is the node up, and are ansible_host, "
            "ansible_port and the SSH options (ProxyJump, ~/.ssh/config) right?")


def connect(name: str, target: SshTarget, within: float | None = None) -> Connection:
    """An open connection to the node; PreflightError naming the node and the fix if not
    (with WITHIN: if none within that many seconds)."""
    return Connection(name, target).open(within)


def wait_until_it_answers(name: str, target: SshTarget, timeout: float) -> None:
    """Until the node's SSH answers (a node starting again); PreflightError after TIMEOUT."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            connect(name, target).close()
            return
        except PreflightError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def connect_all(specs: list[Any]) -> dict[str, Connection]:
    """An open connection to each node (anything with .name and .ssh), made at once; the
    first node's error (in order) if any failed, with the others closed again."""
    results = each(specs, lambda s: connect(s.name, s.ssh), lambda s: s.name)
    if results.failed:
        for r in results.values():
            if r.value is not None:
                r.value.close()
    return results.values_or_raise()

