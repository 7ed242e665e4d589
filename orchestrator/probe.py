"""What preflight asks each node, in one SSH round trip: a small script for the node's
system python that answers in JSON."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from . import ssh
from .inventory import NodeSpec

# Master-port claims on node 0, shared by every user of the node (see `claim` below).
LEASE_DIR = "/tmp/clustertrain-ports"

# Runs on the node with its system python (stdlib only). Input on stdin, JSON on stdout.
PROBE_SCRIPT = r'''
import getpass, json, os, socket, subprocess, sys, time
req = json.load(sys.stdin)
out = {"user": getpass.getuser(), "uid": os.getuid(), "home": os.path.expanduser("~")}

def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh), None
    except FileNotFoundError:
        return None, f"{path} is missing"
    except (OSError, ValueError) as exc:
        return None, f"{path}: {exc}"

out["fingerprint"], out["fingerprint_error"] = read_json("/etc/clustertrain/fingerprint.json")
env, out["python_env_error"] = read_json("/etc/clustertrain/python_env.json")
out["python_env"] = env
cluster_env = {}
try:
    for line in open("/etc/clustertrain/cluster.env"):
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, _, v = line.partition("=")
            cluster_env[k.strip()] = v.strip().strip('"')
except OSError:
    pass
out["cluster_env"] = cluster_env

torch = {"ok": False, "version": None, "gpus": 0, "error": None}
if env and env.get("python"):
    code = ("import json, torch; print(json.dumps({'version': torch.__version__, "
            "'gpus': torch.cuda.device_count() if torch.cuda.is_available() else 0}))")
    try:
        p = subprocess.run([env["python"], "-c", code], capture_output=True, text=True,
                           timeout=120)
        if p.returncode == 0:
            torch.update(json.loads(p.stdout.strip().splitlines()[-1]), ok=True)
        else:
            torch["error"] = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        torch["error"] = str(exc)
    torch["torchrun"] = bool(env.get("torchrun")) and os.access(env["torchrun"], os.X_OK)
else:
    torch["error"] = out["python_env_error"] or "python_env.json has no 'python'"
out["torch"] = torch

shared = req["shared_path"]
try:
    os.listdir(shared)
    out["shared"] = {"ok": True, "mount": os.path.ismount(shared), "error": None}
except OSError as exc:
    out["shared"] = {"ok": False, "mount": False, "error": f"{shared}: {exc.strerror}"}

def port_free(port):
    # SO_REUSEADDR as torch's TCPStore sets it: a listener makes the port taken, sockets
    # left in TIME_WAIT by the previous run's connections do not.
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        s.close()

# Leases: two launches (any users) that probe at the same moment must not both take
# one port before either torchrun listens on it. A launch claims a free port with a file
# LEASES/<port>.<user>.<random> (a directory like /tmp: every user may add, nobody may
# remove another's); the oldest live claim of a port wins, the others try the next port.
# A claim lives LEASE_S seconds: by then the job's TCPStore holds the port itself.
LEASES, LEASE_S = "LEASE_DIR", 120

def claims(port):
    now, found = time.time(), []
    for name in os.listdir(LEASES):
        if name.split(".")[0] == str(port):
            try:
                st = os.stat(os.path.join(LEASES, name))
            except OSError:
                continue
            if now - st.st_mtime < LEASE_S:
                found.append((st.st_mtime_ns, name))
    return sorted(found)

def claim(port):
    if not port_free(port) or claims(port):
        return False
    if not req.get("run"):  # preflight alone: look, claim nothing
        return True
    mine = f"{port}.{out['user']}.{req['run']}"
    open(os.path.join(LEASES, mine), "w").close()
    if claims(port)[0][1] == mine:
        return True
    os.unlink(os.path.join(LEASES, mine))
    return False

if req.get("port"):
    port = req["port"]
    try:
        os.makedirs(LEASES, exist_ok=True)
        if os.stat(LEASES).st_uid == os.getuid():
            os.chmod(LEASES, 0o1777)
        for name in os.listdir(LEASES):  # my own expired claims
            path = os.path.join(LEASES, name)
            if name.split(".")[1:2] == [out["user"]] and time.time() - os.stat(path).st_mtime > LEASE_S:
                os.unlink(path)
        out["port_free"] = claim(port)
        out["free_port"] = port if out["port_free"] else next(
            (p for p in range(port + 1, port + 200) if claim(p)), None)
    except OSError as exc:
        out["port_free"], out["free_port"], out["port_error"] = False, None, str(exc)

resolve = {}
for name in req.get("addresses", []):
    try:
        resolve[name] = socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
    except OSError:
        resolve[name] = None
out["resolve"] = resolve
out["time"] = time.time()
print(json.dumps(out))
'''.replace('"LEASE_DIR"', repr(LEASE_DIR))


@dataclass
class NodeFacts:
    """What preflight learned about one node (error set when SSH itself failed)."""

    node: NodeSpec
    error: str | None = None
    user: str | None = None          # who the job runs as on this node
    uid: int | None = None
    home: str | None = None
    fingerprint: dict[str, Any] | None = None
    fingerprint_error: str | None = None
    python_env: dict[str, Any] | None = None
    python_env_error: str | None = None
    cluster_env: dict[str, str] = field(default_factory=dict)
    torch: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    port_free: bool | None = None
    free_port: int | None = None
    port_error: str | None = None
    resolve: dict[str, str | None] = field(default_factory=dict)  # cluster address -> IP
    clock_offset: float | None = None  # node clock minus controller clock, seconds

    @property
    def gpus(self) -> int:
        return int(self.torch.get("gpus") or 0)


def release_port(conn: ssh.Connection, run_id: str) -> None:
    """Drop the master-port claim a launch made on node 0 (it would lapse by itself)."""
    conn.run(f"rm -f {LEASE_DIR}/*.{shlex.quote(run_id)}", timeout=30)


def probe(node: NodeSpec, conn: ssh.Connection, *, shared_path: str,
          addresses: list[str], port: int | None, run_id: str | None = None) -> NodeFacts:
    """What NODE is like now. With PORT (node 0), whether that master port is free, else
    the next free one; with RUN_ID too, the port found is claimed for that run."""
    request = json.dumps({"shared_path": shared_path, "addresses": addresses, "port": port,
                          "run": run_id})
    result = conn.run(f"{node.python} -c {shlex.quote(PROBE_SCRIPT)}", timeout=150,
                      stdin=request)
    received = time.time()
    if result.exit_code != 0:
        return NodeFacts(node, error=f"probe failed with {node.python}: "
                         f"{(result.stderr.strip().splitlines() or ['exit %d' % result.exit_code])[-1]}")
    data = json.loads(result.stdout.strip().splitlines()[-1])
    facts = NodeFacts(node, **{k: v for k, v in data.items() if k != "time"})
    facts.clock_offset = data["time"] - received
    return facts

