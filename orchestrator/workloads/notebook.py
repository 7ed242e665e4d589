"""`clustertrain notebook`: JupyterLab on a node, as a run of its own.

A notebook is a run (one node, one process, `-m orchestrator.node.notebook`, no code
synced, no hang watch): it gets everything a run gets, written once in the run's
lifecycle. Preflight refuses drift and a busy node, `--python-env` chooses the
environment its kernels run in, `--queue` waits for Slurm to grant the node, the nodes
supervise it (it ends with the command: Ctrl-C, a closed terminal, kill -9 of the
controller), `runs` and the node's busy list show it, `stop` ends it, its log is kept.

What is its own: where it starts (the least busy node unless --host says), and the way
in. The server listens on the node's loopback only, on a port it chose there, with a
token it made there (node/notebook.py); both are read from the job's directory over SSH,
and an SSH tunnel (cluster/ssh.forward: the same SSH as every connection, bastions
included) brings the port to this machine's loopback. Nothing opens a port to the network.

Detached (`--detach`), the server ends itself after `--idle` seconds without a request;
the command keeps the tunnel open until Ctrl-C, and `notebook connect RUN` opens it again.
"""

from __future__ import annotations

import json
import math
import shlex
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import defaults
from ..cluster import nodelib
from ..cluster.fanout import each
from ..cluster.inventory import Cluster, NodeSpec, check_env_name, load_cluster
from ..cluster.ssh import SshTarget, connect, forward
from ..errors import ClusterError, InputError, LaunchError
from ..node.protocol import NOTEBOOK_FILE, NOTEBOOK_MODULE
from ..record.rundir import check_writable, new_run_id, open_run
from ..run.command import NodeCommand
from ..run.drain import cordons
from ..run.lifecycle import run_training
from ..run.settle import settle
from ..run.spec import Given, RunSpec, option_label, queue_options

DEFAULT_IDLE = 3600.0      # a detached notebook ends after an hour without a request
READY_WITHIN = 180.0       # seconds for JupyterLab to answer once its run has started
LOOK_EVERY = 0.5           # seconds between looks for the server's port and answer
FIRST_LOCAL_PORT = 8888    # the tunnel's end here: this port, else the next free one


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
    status (attached), or 0 once the tunnel of a detached one is closed with Ctrl-C."""
    if spec.hosts is None and not spec.queue:
        host = least_busy(uncordoned(load_cluster(spec.inventory)))
        spec = replace(spec, nodes=None, hosts=(host,))
        print(f"notebook: on {host}, the least busy node (--host chooses)", flush=True)

    def serving(command: NodeCommand, node: NodeSpec, conn: Any) -> Tunnel:
        return Tunnel(node.ssh, command, conn, local_port, detached=False)

    code = run_training(spec, serving=None if spec.detach else serving)
    if code or not spec.detach:
        return code
    assert spec.run_id is not None
    return connect_notebook(spec.runs_dir, spec.run_id, local_port)


def connect_notebook(runs_dir: Path, run_id: str, local_port: int | None = None) -> int:
    """`notebook connect RUN`: the tunnel to a running notebook again, open until Ctrl-C."""
    run = open_run(runs_dir, run_id)
    info = run.info()
    if info.get("script") != NOTEBOOK_MODULE:
        raise ClusterError(f"run {run_id} is not a notebook (it ran {info.get('script')}); "
                           "see `runs` for the notebooks")
    summary = settle(run)   # one that ended while nobody followed it: from its node
    if summary is not None:
        raise ClusterError(f"notebook {run_id} has ended ({summary.get('status')}); start "
                           "another with `notebook`")
    name = info["nodes"][0]
    command = NodeCommand.from_record(info["node_commands"][name])
    node = load_cluster(info["inventory"]).select(hosts=name).nodes[0]
    conn = connect(node.name, node.ssh, within=60)
    try:
        with Tunnel(node.ssh, command, conn, local_port, detached=True) as tunnel:
            tunnel.wait()
    except KeyboardInterrupt:
        print(f"notebook {run_id}: tunnel closed; the notebook runs on {name} until "
              f"it is idle for its --idle time (end it: notebook stop {run_id}; again: "
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
        said = nodelib.call(conn, node.python, "busy", timeout=60)
    finally:
        conn.close()
    data = json.loads(said.stdout)
    return len(data.get("runs", [])) + len(data.get("gpu_processes", []))


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


def free_local_port(first: int = FIRST_LOCAL_PORT) -> int:
    """FIRST if it is free on this machine's loopback, else the next free one (of 100),
    else any."""
    for port in [*range(first, first + 100), 0]:
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise LaunchError("no free port on this machine's loopback for the tunnel")


class Tunnel(AbstractContextManager):
    """The way to one notebook, while the context lasts: in a thread, the server's port
    and token are read from its job directory (COMMAND's, through CONN), an SSH tunnel
    is opened to it, and once JupyterLab answers through the tunnel, its URL is said.
    The tunnel ends with the context (and with this process, however it ends)."""

    def __init__(self, target: SshTarget, command: NodeCommand, conn: Any,
                 local_port: int | None, detached: bool,
                 say: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        self.target, self.command, self.conn = target, command, conn
        self.local_port, self.detached, self.say = local_port, detached, say
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
        """The server's port and token, once its job directory has them (None: stopped
        or READY_WITHIN passed)."""
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
        port = self.local_port or free_local_port()
        tunnel = forward(self.target, port, served.port)
        try:
            url = f"http://127.0.0.1:{port}"
            if not self._answers(url, served.token, tunnel):
                if tunnel.poll() is not None:
                    said = _said(tunnel)
                    self.say(f"notebook {self.command.run_id}: the SSH tunnel to "
                             f"{served.node} ended: {said[-300:] or 'no message'}"
                             + (f" (port {port} is in use here? choose another with --port)"
                                if "forward" in said.lower() else ""))
                return
            self.say(f"notebook {self.command.run_id}: JupyterLab on {served.node} (port "
                     f"{served.port} of its loopback), here through SSH:\n"
                     f"  {url}/lab?token={served.token}\n"
                     + ("  Ctrl-C closes the tunnel; the notebook goes on (notebook "
                        f"connect {self.command.run_id} opens it again, notebook stop "
                        f"{self.command.run_id} ends it)" if self.detached else
                        "  Ctrl-C ends it"))
            while not self._stop.wait(1.0):
                if tunnel.poll() is not None:
                    self.say(f"notebook {self.command.run_id}: the SSH tunnel to "
                             f"{served.node} ended ({_said(tunnel)[-300:]})")
                    return
        finally:
            if tunnel.poll() is None:
                tunnel.terminate()
                try:
                    tunnel.wait(timeout=5)
                except Exception:  # noqa: BLE001 - killed then
                    tunnel.kill()

    def _answers(self, url: str, token: str, tunnel: Any) -> bool:
        """True once JupyterLab answers /api/status through the tunnel; False when the
        tunnel ends, the context ends or READY_WITHIN passes."""
        request = urllib.request.Request(f"{url}/api/status",
                                         headers={"Authorization": f"token {token}"})
        waited = 0.0
        while not self._stop.is_set() and tunnel.poll() is None and waited < READY_WITHIN:
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    if answer.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            self._stop.wait(LOOK_EVERY)
            waited += LOOK_EVERY
        if waited >= READY_WITHIN:
            self.say(f"notebook {self.command.run_id}: JupyterLab did not answer through "
                     f"the tunnel within {READY_WITHIN:g} s")
        return False


def _said(process: subprocess.Popen) -> str:
    """What an ended ssh said on its stderr."""
    return process.stderr.read().strip() if process.stderr else ""
