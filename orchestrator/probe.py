"""What preflight asks each node, in one SSH round trip: a small script for the node's
system python that answers in JSON."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

import paramiko

from . import ssh
from .inventory import NodeSpec

# Runs on the node with its system python (stdlib only). Input on stdin, JSON on stdout.
PROBE_SCRIPT = r'''
import json, os, socket, subprocess, sys, time
req = json.load(sys.stdin)
out = {}

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

if req.get("port"):
    port = req["port"]
    out["port_free"] = port_free(port)
    out["free_port"] = port if out["port_free"] else next(
        (p for p in range(port + 1, port + 200) if port_free(p)), None)

resolve = {}
for name in req.get("names", []):
    try:
        resolve[name] = socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
    except OSError:
        resolve[name] = None
out["resolve"] = resolve
out["time"] = time.time()
print(json.dumps(out))
'''


@dataclass
class NodeFacts:
    """What preflight learned about one node (error set when SSH itself failed)."""

    node: NodeSpec
    error: str | None = None
    fingerprint: dict[str, Any] | None = None
    fingerprint_error: str | None = None
    python_env: dict[str, Any] | None = None
    python_env_error: str | None = None
    cluster_env: dict[str, str] = field(default_factory=dict)
    torch: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    port_free: bool | None = None
    free_port: int | None = None
    resolve: dict[str, str | None] = field(default_factory=dict)
    clock_offset: float | None = None  # node clock minus controller clock, seconds

    @property
    def gpus(self) -> int:
        return int(self.torch.get("gpus") or 0)


def probe(node: NodeSpec, client: paramiko.SSHClient, *, shared_path: str,
          names: list[str], port: int | None) -> NodeFacts:
    request = json.dumps({"shared_path": shared_path, "names": names, "port": port})
    result = ssh.run(client, f"{node.python} -c {shlex.quote(PROBE_SCRIPT)}", timeout=150,
                     stdin=request)
    received = time.time()
    if result.exit_code != 0:
        return NodeFacts(node, error=f"probe failed with {node.python}: "
                         f"{(result.stderr.strip().splitlines() or ['exit %d' % result.exit_code])[-1]}")
    data = json.loads(result.stdout.strip().splitlines()[-1])
    facts = NodeFacts(node, **{k: v for k, v in data.items() if k != "time"})
    facts.clock_offset = data["time"] - received
    return facts

