"""What preflight asks each node, and what it learns: the node side is
orchestrator/node_probe.py (standard library only), shipped by its source and run by the
node's system python; it answers in JSON.

Round 1, every node at once (`probe`): who the job runs as, the environment as it is now
(a live fingerprint read from the environment's metadata, roles/python_env/files/
fingerprint.py, the same code the python_env role uses), the fingerprint written at
provisioning, torch (imported only when the environment changed since the last time it
was checked on that node, see TORCH_CACHE), GPUs (without torch), the shared path (a mount
of the right kind, writable by the job's user), names, and on node 0 the master port: a
free one is claimed, and a short-lived listener is started on it.

Round 2, every other node (`reach`): the shared path shows the token node 0 wrote there
(the same filesystem), and node 0's master port answers from here (no firewall between).
The listener ends as soon as every node has connected: torchrun then binds the port.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import secrets
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from . import contract, node_probe, ssh
from .inventory import NodeSpec
from .node_probe import LEASE_DIR
from .resources import project

# Where the python_env role writes python_env.json and fingerprint.json when a request
# names no directory (preflight passes the node's, NodeSpec.env_state_dir).
STATE_DIR = str(contract.role_default("python_env", "python_env_state_dir"))
CONNECT_TIMEOUT = 3.0    # seconds for a node to open a TCP connection to node 0's port
LISTEN_SECONDS = 30.0    # the listener on node 0 gives up after this long


@functools.cache
def fingerprint_lib() -> ModuleType:
    """roles/python_env/files/fingerprint.py as a module (drift comparison, on the
    controller; the nodes run the same file inside the probe)."""
    spec = importlib.util.spec_from_file_location("clustertrain_fingerprint",
                                                  project().fingerprint_py)
    assert spec is not None and spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _program(verb: str, *args: str) -> str:
    """node_probe.py's source and the call of its VERB, for `python -c` on a node."""
    call = f"sys.exit(main([{verb!r}] + sys.argv[1:], {', '.join(args)}))"
    return NODE_PROBE_SOURCE + "\n" + call + "\n"


NODE_PROBE_SOURCE = Path(node_probe.__file__).read_text()
# Round 1 (input on stdin, JSON on stdout); fingerprint.py is the python_env role's own.
PROBE_SCRIPT = _program("probe", repr(project().fingerprint_py.read_text()), repr(STATE_DIR))
REACH_SCRIPT = _program("reach")           # round 2, on every node but node 0
STOP_SCRIPT = _program("stop")             # PORT NONCE: end node 0's listener now


@dataclass
class NodeFacts:
    """What preflight learned about one node (error set when SSH itself failed)."""

    node: NodeSpec
    error: str | None = None
    user: str | None = None          # who the job runs as on this node
    uid: int | None = None
    home: str | None = None
    machine: dict[str, str] | None = None   # node_probe.machine(): what tells machines apart
    fingerprint: dict[str, Any] | None = None   # the environment as it is now
    fingerprint_error: str | None = None
    provisioned: dict[str, Any] | None = None   # fingerprint.json, written at provisioning
    provisioned_error: str | None = None
    python_env: dict[str, Any] | None = None
    python_env_error: str | None = None
    cluster_env: dict[str, str] = field(default_factory=dict)
    torch: dict[str, Any] = field(default_factory=dict)
    gpu_count: int | None = None     # GPUs the driver shows (no torch), None: not read
    gpu_source: str | None = None
    shared: dict[str, Any] = field(default_factory=dict)
    port_free: bool | None = None
    free_port: int | None = None
    port_error: str | None = None
    listener: dict[str, Any] | None = None      # node 0: the master-port listener
    reach: dict[str, Any] | None = None         # round 2: token seen, master port reached
    resolve: dict[str, str | None] = field(default_factory=dict)  # cluster address -> IP
    clock_offset: float | None = None  # node clock minus controller clock, seconds
    seconds: float | None = None       # how long the probe ran on the node

    @property
    def gpus(self) -> int:
        if self.gpu_count is not None:
            return int(self.gpu_count)
        return int(self.torch.get("gpus") or 0)


@dataclass(frozen=True)
class Rendezvous:
    """What node 0's listener expects: a nonce it greets with, how many connections, and
    the token file it wrote on the share (read by the others)."""

    nonce: str
    token_name: str
    token_value: str
    expect: int

    @classmethod
    def new(cls, nodes: int) -> Rendezvous:
        nonce = secrets.token_hex(8)
        return cls(nonce, f".clustertrain-token-{nonce}", secrets.token_hex(16), nodes)


def release_port(conn: ssh.Connection, run_id: str) -> None:
    """Drop the master-port claim a launch made on node 0 (it would lapse by itself)."""
    conn.run(f"rm -f {LEASE_DIR}/*.{shlex.quote(run_id)}", timeout=30)


def probe(node: NodeSpec, conn: ssh.Connection, *, shared: dict[str, Any],
          addresses: list[str], port: int | None, run_id: str | None = None,
          strict_port: bool = False, rendezvous: Rendezvous | None = None,
          master_address: str | None = None) -> NodeFacts:
    """What NODE is like now (round 1). SHARED: {"path", "fstypes"} (fstypes None: any
    mount). With PORT (node 0), whether that master port is free, else the next free one;
    with RUN_ID too, the port found is claimed for that run; with RENDEZVOUS, node 0
    writes its token on the share and listens on that port until all nodes connected."""
    spec = dict(shared)
    request: dict[str, Any] = {"shared": spec, "addresses": addresses, "port": port,
                               "run": run_id, "strict": strict_port,
                               "state_dir": node.env_state_dir}
    if rendezvous is not None:
        spec["token"] = {"name": rendezvous.token_name, "value": rendezvous.token_value}
        request["listen"] = {"nonce": rendezvous.nonce, "expect": rendezvous.expect,
                             "address": master_address, "timeout": CONNECT_TIMEOUT,
                             "seconds": LISTEN_SECONDS}
    result = conn.run(f"{node.python} -c {shlex.quote(PROBE_SCRIPT)}", timeout=150,
                      stdin=json.dumps(request))
    received = time.time()
    if result.exit_code != 0:
        last = (result.stderr.strip().splitlines() or ['exit %d' % result.exit_code])[-1]
        return NodeFacts(node, error=f"probe failed with {node.python}: {last}")
    data = json.loads(result.stdout.strip().splitlines()[-1])
    facts = NodeFacts(node, **{k: v for k, v in data.items() if k != "time"})
    facts.clock_offset = data["time"] - received
    return facts


def reach(node: NodeSpec, conn: ssh.Connection, *, addr: str, port: int,
          rendezvous: Rendezvous, shared_path: str) -> dict[str, Any]:
    """Round 2 on a node other than node 0: does it see node 0's token on the shared path,
    and does node 0's listener on the master port answer it?"""
    request = {"addr": addr, "port": port, "nonce": rendezvous.nonce,
               "timeout": CONNECT_TIMEOUT,
               "token": {"path": f"{shared_path.rstrip('/')}/checkpoints/{rendezvous.token_name}",
                         "value": rendezvous.token_value}}
    result = conn.run(f"{node.python} -c {shlex.quote(REACH_SCRIPT)}",
                      timeout=CONNECT_TIMEOUT * 3 + 30, stdin=json.dumps(request))
    if result.exit_code != 0:
        return {"error": (result.stderr.strip().splitlines() or
                          ["exit %d" % result.exit_code])[-1]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def stop_listener(node: NodeSpec, conn: ssh.Connection, port: int, nonce: str) -> None:
    """End node 0's listener now (when not every node connected to it)."""
    conn.run(f"{node.python} -c {shlex.quote(STOP_SCRIPT)} {port} {nonce}", timeout=30)
