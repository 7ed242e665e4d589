"""`clustertrain notebook`: JupyterLab on a node, as a run of its own.

A notebook is a run (one node, one process, `-m orchestrator.node.notebook`, no code
synced, no hang watch): it gets everything a run gets, written once in the run's
lifecycle. Preflight refuses drift and a busy node, `--python-env` chooses the
environment its kernels run in, `--queue` waits for Slurm to grant the node, the nodes
supervise it (it ends with the command: Ctrl-C, a closed terminal, kill -9 of the
controller), `runs` and the node's busy list show it, `stop` ends it, its log is kept.

What is its own: where it starts (the least busy node unless --host says), and the way
in. The server listens on the node's loopback only, on a port it chose there
(node/notebook.py), read from the job's directory over SSH. This machine may be shared
with users who must not reach the notebook, so the way in is held end to end:
- the local port (FIRST_LOCAL_PORT or the next free one, or --port) is bound and listened
  on by this command first thing, and held until it ends: no moment in which another user
  could take it and receive the token. Each connection to it is relayed (Relay) to an SSH
  tunnel (cluster/ssh.forward: the same SSH as every connection, bastions included) whose
  local end is a Unix socket in a private (0700) directory, and the readiness check goes
  to that socket, never to a TCP port;
- the token in the printed URL is this command's own (Access): written to the node's
  access file when the tunnel opens, touched while it is open, removed when it ends; the
  node voids it (and every login cookie) once the file is gone or stale. A URL opened
  again after its command ended, wherever it lands, opens nothing.
Nothing opens a port to the network.

Detached (`--detach`), the server ends itself after `--idle` seconds without a request;
the command keeps the tunnel open until Ctrl-C, and `notebook connect RUN` opens it again.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import secrets
import selectors
import shlex
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import defaults
from ..cluster import nodelib
from ..cluster.drain import cordons
from ..cluster.fanout import each
from ..cluster.inventory import Cluster, NodeSpec, check_env_name, load_cluster
from ..cluster.ssh import SshTarget, connect, forward
from ..errors import ClusterError, InputError, LaunchError
from ..node import requests as rq
from ..node.notebook import ACCESS_FILE
from ..node.protocol import NOTEBOOK_FILE, NOTEBOOK_MODULE
from ..record.rundir import check_writable, new_run_id, open_run
from ..run.command import NodeCommand
from ..run.lifecycle import run_training
from ..run.settle import settle
from ..run.spec import Given, RunSpec, option_label, queue_options

DEFAULT_IDLE = 3600.0      # a detached notebook ends after an hour without a request
READY_WITHIN = 180.0       # seconds for JupyterLab to answer once its run has started
LOOK_EVERY = 0.5           # seconds between looks for the server's port and answer
FIRST_LOCAL_PORT = 8888    # the tunnel's end here: this port, else the next free one
REFRESH_EVERY = 30.0       # seconds between touches of the node's access file (node's
                           # STALE_AFTER, 90 s, voids the token of a tunnel that stopped)


@dataclass(frozen=True)
class Served:
    """Where a notebook's server listens on its node, and its token."""
    node: str
    port: int
    token: str

    @classmethod
    def parse(cls, node: str, text: str) -> Served:
        data = json.loads(text)
        return cls(node, int(data["port"]), str(data["token"]))


def notebook_spec(given: Mapping[str, Given]) -> RunSpec:
    """The notebook's run from what `notebook` was given (inventory, host, python_env,
    detach, idle, runs_dir, share_gpus, queue and its options); LaunchError naming a
    value that cannot be right, before any node is touched."""
    def get(key: str, default: Any = None) -> Any:
        return given[key].value if key in given else default

    def label(key: str) -> str:
        return given[key].label if key in given else option_label(key)

    idle = float(get("idle", DEFAULT_IDLE))
    if not math.isfinite(idle) or idle < 0:
        raise InputError(f"{label('idle')} {get('idle')}: give the seconds without a "
                         "request after which a detached notebook ends, 0 or more (0: "
                         f"never; default {DEFAULT_IDLE:g})")
    if "idle" in given and not get("detach"):
        raise InputError(f"{label('idle')} goes with --detach (an attached notebook ends "
                         "with the command); add --detach, or leave it out")
    runs_dir = Path(str(get("runs_dir", defaults.RUNS_DIR)))
    check_writable(runs_dir, label("runs_dir"))
    python_env = get("python_env")
    if python_env is not None:
        check_env_name(str(python_env), label("python_env"))
    host = get("host")
    return RunSpec(
        inventory=Path(str(get("inventory", defaults.INVENTORY))),
        nodes=None if host else 1, hosts=(host,) if host else None, workdir=None,
        script=NOTEBOOK_MODULE, module=True,
        script_args=("--idle", f"{idle:g}") if get("detach") else (),
        nproc_per_node=1, hang_timeout=0.0, runs_dir=runs_dir,
        detach=bool(get("detach")), share_gpus=bool(get("share_gpus")),
        python_env=python_env, run_id=new_run_id(), **queue_options(given, label))


def run_notebook(spec: RunSpec, local_port: int | None = None) -> int:
    """`notebook`: the notebook's run on its node, and the tunnel to it; the run's exit
    status (attached), or 0 once the tunnel of a detached one is closed with Ctrl-C. The
    local port (LOCAL_PORT, else the first free from FIRST_LOCAL_PORT) is held first, and
    until the command ends."""
    with closing(hold_local_port(local_port)) as local:
        if spec.hosts is None and not spec.queue:
            host = least_busy(uncordoned(load_cluster(spec.inventory)))
            spec = replace(spec, nodes=None, hosts=(host,))
            print(f"notebook: on {host}, the least busy node (--host chooses)", flush=True)

        def serving(command: NodeCommand, node: NodeSpec, conn: Any) -> Tunnel:
            return Tunnel(node.ssh, command, conn, local, detached=False)

        code = run_training(spec, serving=None if spec.detach else serving)
        if code or not spec.detach:
            return code
        assert spec.run_id is not None
        return _connect(spec.runs_dir, spec.run_id, local)


def connect_notebook(runs_dir: Path, run_id: str, local_port: int | None = None) -> int:
    """`notebook connect RUN`: the tunnel to a running notebook again, open until Ctrl-C,
    from a local port held first (LOCAL_PORT, else the first free from FIRST_LOCAL_PORT)."""
    with closing(hold_local_port(local_port)) as local:
        return _connect(runs_dir, run_id, local)


def _connect(runs_dir: Path, run_id: str, local: socket.socket) -> int:
    """The tunnel to notebook RUN_ID from LOCAL (a port this command holds), until Ctrl-C."""
    run = open_run(runs_dir, run_id)
    info = run.info()
    if info.get("script") != NOTEBOOK_MODULE:
        raise ClusterError(f"run {run_id} is not a notebook (it ran {info.get('script')}); "
                           "see `runs` for the notebooks")
    summary = settle(run)   # one that ended while nobody followed it: from its node
    if summary is not None:
        raise ClusterError(f"notebook {run_id} has ended ({summary.status}); start "
                           "another with `notebook`")
    name = info["nodes"][0]
    command = NodeCommand.from_record(info["node_commands"][name])
    node = load_cluster(info["inventory"]).select(hosts=name).nodes[0]
    conn = connect(node.name, node.ssh, within=60)
    try:
        with Tunnel(node.ssh, command, conn, local, detached=True) as tunnel:
            tunnel.wait()
    except KeyboardInterrupt:
        print(f"notebook {run_id}: tunnel closed, its URL void; the notebook runs on {name} "
              f"until it is idle for its --idle time (end it: notebook stop {run_id}; again: "
              f"notebook connect {run_id})", flush=True)
        return 0
    finally:
        conn.close()
    return 1


def uncordoned(cluster: Cluster,
               read: Callable[[Cluster], dict[str, dict[str, Any]]] = cordons) -> Cluster:
    """CLUSTER without the nodes the share's record cordons (READ: through its first
    node; an idle node is often idle because it is cordoned); as it is when the record
    cannot be read (preflight then names what is wrong with the node chosen).
    LaunchError when every node is cordoned."""
    try:
        cordoned = read(cluster)
    except ClusterError:
        return cluster
    left = [name for name in cluster.names if name not in cordoned]
    if not left:
        raise LaunchError("every training node is cordoned ("
                          + "; ".join(f"{n}: {c.get('why', '?')}" for n, c in cordoned.items()
                                      if n in cluster.names)
                          + "); uncordon one once it is fixed (`uncordon NODE`), or choose "
                          "one with --host")
    return cluster.select(hosts=",".join(left))


def busy_count(node: NodeSpec) -> int:
    """How many live runs and GPU processes (any user's) NODE has now (`node.py busy`)."""
    conn = connect(node.name, node.ssh, within=30)
    try:
        said = nodelib.ask(conn, node.python, rq.Busy(), node=node.name, timeout=60)
    finally:
        conn.close()
    return len(said.runs) + len(said.gpu_processes)


def least_busy(cluster: Cluster, count: Callable[[NodeSpec], int] = busy_count) -> str:
    """The training node with the fewest live runs and GPU processes (COUNT, asked of
    every node at once), the first in the inventory's order among equals; nodes that
    cannot be asked are passed over (preflight names what is wrong with a node once it
    is chosen)."""
    results = each(cluster.nodes, count, lambda n: n.name)
    counts = {name: r.value for name, r in results.items() if r.ok and r.value is not None}
    if not counts:
        raise LaunchError("no training node could be asked who uses it: "
                          + "; ".join(f"{n}: {e}" for n, e in results.failed.items())
                          + ". Choose a node with --host")
    return min(counts, key=lambda name: (counts[name], cluster.names.index(name)))


class PortTaken(InputError):
    """The local port asked for (--port) is held by another program or user here."""


def hold_local_port(port: int | None = None, first: int = FIRST_LOCAL_PORT) -> socket.socket:
    """A socket of this process listening on this machine's loopback, held until it is
    closed: PORT (--port), else FIRST if it is free, else the next free one (of 100), else
    any. Holding it from the command's start to its end leaves no moment in which another
    user could take the port that the printed URL names (and so receive the token).
    PortTaken naming PORT and the fix when it is in use."""
    for candidate in [port] if port else [*range(first, first + 100), 0]:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", candidate))
            s.listen(64)
        except OSError as exc:
            s.close()
            if port:
                raise PortTaken(f"port {port} of this machine's loopback is in use (by another "
                                f"program or user: {exc.strerror}); choose another with "
                                "--port, or leave --port out for the first free one") from exc
            continue
        return s
    raise LaunchError("no free port on this machine's loopback for the tunnel")


def pipe(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways between A and B until both have ended their side (each end's EOF
    passed on to the other), or either fails; both are closed then."""
    peer = {a: b, b: a}
    with selectors.DefaultSelector() as sel, closing(a), closing(b):
        for s in (a, b):
            sel.register(s, selectors.EVENT_READ)
        open_ends = 2
        while open_ends:
            for key, _ in sel.select(timeout=1.0):
                src: socket.socket = key.fileobj   # type: ignore[assignment]
                try:
                    data = src.recv(65536)
                    if data:
                        peer[src].sendall(data)
                        continue
                    sel.unregister(src)
                    open_ends -= 1
                    peer[src].shutdown(socket.SHUT_WR)
                except OSError:
                    return


class Relay:
    """Each connection accepted on LISTENER (the port this command holds), carried to the
    Unix socket at PATH (ssh's local end of the tunnel), each in a thread of its own, while
    the relay runs; a connection that comes while the tunnel is not open is closed."""

    def __init__(self, listener: socket.socket, path: str) -> None:
        self.listener, self.path = listener, path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="notebook-relay",
                                        daemon=True)

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.listener, selectors.EVENT_READ)
            while not self._stop.is_set():
                if not sel.select(timeout=0.2):
                    continue
                try:
                    client, _ = self.listener.accept()
                except OSError:
                    continue
                threading.Thread(target=self._carry, args=(client,), name="notebook-pipe",
                                 daemon=True).start()

    def _carry(self, client: socket.socket) -> None:
        node = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            node.connect(self.path)
        except OSError:
            node.close()
            client.close()
            return
        pipe(client, node)


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP to 127.0.0.1 through the Unix socket at PATH (the tunnel's own end, which no
    other user can open), not through a TCP port."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("127.0.0.1", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.unix_path)
        except OSError:
            s.close()
            raise
        self.sock = s


def status_through(path: str, token: str) -> int | None:
    """The HTTP status of JupyterLab's /api/status asked with TOKEN through the Unix socket
    at PATH; None when nothing answers there (yet)."""
    conn = UnixHTTPConnection(path, timeout=5)
    try:
        conn.request("GET", "/api/status", headers={"Authorization": f"token {token}"})
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def access_path(command: NodeCommand) -> str:
    """The node's file that says which token opens the notebook (node/notebook.py)."""
    return f"{command.job_dir}/{ACCESS_FILE}"


class Access:
    """The short-lived token of one tunnel: written to the node's access file (0600, under
    the user's private job directory; the token goes over SSH's stdin, on no command line)
    when the tunnel opens, touched every REFRESH_EVERY seconds while it is open (the node
    voids it once it is STALE_AFTER seconds old), removed when the tunnel ends, unless a
    later tunnel has written its own since."""

    def __init__(self, conn: Any, command: NodeCommand) -> None:
        self.conn, self.path = conn, access_path(command)
        self.token = secrets.token_urlsafe(32)
        self.mark = secrets.token_hex(8)   # this tunnel's, not secret: whose file it is
        self.touched = 0.0

    def write(self) -> None:
        path = shlex.quote(self.path)
        said = self.conn.run(f"umask 077 && cat > {path}.tmp && mv -f {path}.tmp {path}",
                             timeout=30, stdin=json.dumps({"token": self.token,
                                                           "mark": self.mark}))
        if said.exit_code != 0:
            raise ClusterError(f"could not write the notebook's access file {self.path}: "
                               f"{said.stderr.strip()[-300:] or 'no message'}")
        self.touched = time.monotonic()

    def refresh(self) -> None:
        """Touch the file if REFRESH_EVERY seconds have passed since the last touch."""
        if time.monotonic() - self.touched < REFRESH_EVERY:
            return
        self.touched = time.monotonic()
        try:
            self.conn.run(f"touch -c {shlex.quote(self.path)}", timeout=30)
        except Exception:  # noqa: BLE001 - tried again in REFRESH_EVERY s (3 tries a stale)
            pass

    def remove(self) -> None:
        path = shlex.quote(self.path)
        try:
            self.conn.run(f"grep -qF {shlex.quote(self.mark)} {path} 2>/dev/null && rm -f "
                          f"{path}", timeout=30)
        except Exception:  # noqa: BLE001 - the node voids it when it is stale
            pass


class Tunnel(AbstractContextManager):
    """The way to one notebook, while the context lasts: in a thread, the server's port is
    read from its job directory (COMMAND's, through CONN), a token of this tunnel's own is
    given to the node (Access), an SSH tunnel is opened from a Unix socket in a private
    directory here to the server's port, LOCAL (a port this command holds) is relayed to
    it, and once JupyterLab answers with the token, its URL is said. The tunnel ends with
    the context (and with this process, however it ends); the token with the tunnel."""

    def __init__(self, target: SshTarget, command: NodeCommand, conn: Any,
                 local: socket.socket, detached: bool,
                 say: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        self.target, self.command, self.conn = target, command, conn
        self.local, self.detached, self.say = local, detached, say
        self._stop = threading.Event()
        self._ended = threading.Event()   # the tunnel's thread is done
        self._thread = threading.Thread(target=self._serve, name="notebook-tunnel",
                                        daemon=True)

    def __enter__(self) -> Tunnel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def wait(self) -> None:
        """Until the tunnel ends (its SSH connection lost, or the server never answered)."""
        while not self._ended.wait(1.0):
            pass

    def _served(self) -> Served | None:
        """The server's port, once its job directory has it (None: stopped or READY_WITHIN
        passed)."""
        path = f"{self.command.job_dir}/{NOTEBOOK_FILE}"
        waited = 0.0
        while not self._stop.is_set() and waited < READY_WITHIN:
            said = self.conn.run(f"cat {shlex.quote(path)} 2>/dev/null", timeout=30)
            if said.exit_code == 0 and said.stdout.strip():
                return Served.parse(self.command.node, said.stdout)
            self._stop.wait(LOOK_EVERY)
            waited += LOOK_EVERY
        return None

    def _serve(self) -> None:
        try:
            self._open()
        except Exception as exc:  # noqa: BLE001 - said; the run goes on without a tunnel
            self.say(f"notebook {self.command.run_id}: no tunnel: {exc}")
        finally:
            self._ended.set()

    def _open(self) -> None:
        served = self._served()
        if served is None:
            if not self._stop.is_set():
                self.say(f"notebook {self.command.run_id}: JupyterLab did not say its port "
                         f"within {READY_WITHIN:g} s; see its log above")
            return
        access = Access(self.conn, self.command)
        access.write()
        try:
            with tempfile.TemporaryDirectory(prefix="clustertrain-nb-",
                                             dir=_short_tmp()) as private:
                # mkdtemp's directory is 0700: only this user can open the socket in it.
                sock = os.path.join(private, "tunnel.sock")
                tunnel = forward(self.target, sock, served.port)
                try:
                    with Relay(self.local, sock):
                        self._while_open(served, tunnel, sock, access)
                finally:
                    _end(tunnel)
        finally:
            access.remove()

    def _while_open(self, served: Served, tunnel: subprocess.Popen, sock: str,
                    access: Access) -> None:
        if not self._answers(sock, access.token, tunnel):
            if tunnel.poll() is not None:
                self.say(f"notebook {self.command.run_id}: the SSH tunnel to {served.node} "
                         f"ended: {_said(tunnel)[-300:] or 'no message'}")
            return
        run_id = self.command.run_id
        self.say(f"notebook {run_id}: JupyterLab on {served.node} (port {served.port} of its "
                 "loopback), here through SSH:\n"
                 f"  http://127.0.0.1:{self.local.getsockname()[1]}/lab?token={access.token}\n"
                 "  This URL (its token) works only while this command runs: "
                 + (f"Ctrl-C closes the tunnel and voids it; the notebook goes on "
                    f"(notebook connect {run_id} opens it again, with a new URL; notebook "
                    f"stop {run_id} ends it)" if self.detached else "Ctrl-C ends it"))
        while not self._stop.wait(1.0):
            if tunnel.poll() is not None:
                self.say(f"notebook {run_id}: the SSH tunnel to {served.node} ended "
                         f"({_said(tunnel)[-300:]})")
                return
            access.refresh()

    def _answers(self, sock: str, token: str, tunnel: subprocess.Popen) -> bool:
        """True once JupyterLab answers /api/status with TOKEN through the tunnel's Unix
        socket (never a TCP port: whoever held it would receive the token); False when the
        tunnel ends, the context ends or READY_WITHIN passes."""
        waited = 0.0
        while not self._stop.is_set() and tunnel.poll() is None and waited < READY_WITHIN:
            if status_through(sock, token) == 200:
                return True
            self._stop.wait(LOOK_EVERY)
            waited += LOOK_EVERY
        if waited >= READY_WITHIN:
            self.say(f"notebook {self.command.run_id}: JupyterLab did not answer through "
                     f"the tunnel within {READY_WITHIN:g} s")
        return False


def _short_tmp() -> str | None:
    """Where the tunnel's private directory goes: the temporary directory, unless its path
    is too long for a Unix socket's (107 bytes in all), then /tmp."""
    return None if len(tempfile.gettempdir()) <= 60 else "/tmp"


def _end(process: subprocess.Popen) -> None:
    """PROCESS (ssh) ended: SIGTERM, then SIGKILL after 5 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _said(process: subprocess.Popen) -> str:
    """What an ended ssh said on its stderr."""
    return process.stderr.read().strip() if process.stderr else ""
