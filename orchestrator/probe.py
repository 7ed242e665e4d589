"""What preflight asks each node: small scripts for the node's system python (standard
library only) that answer in JSON.

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
from types import ModuleType
from typing import Any

from . import contract, ssh
from .inventory import NodeSpec
from .resources import project

# Master-port claims on node 0, shared by every user of the node (see `claim` below).
LEASE_DIR = "/tmp/clustertrain-ports"
# Where the python_env role writes python_env.json and fingerprint.json when a request
# names no directory (preflight passes the node's, NodeSpec.env_state_dir).
STATE_DIR = str(contract.role_default("python_env", "python_env_state_dir"))
# Per user on each node: the result of the last torch import, keyed by the live fingerprint.
TORCH_CACHE = ".cache/clustertrain/torch-check.json"
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


# Round 1. Input on stdin, JSON on stdout. FP (fingerprint.py's functions) is prepended.
_PROBE_BODY = r'''
import getpass, hashlib, json, os, socket, subprocess, sys, time
req = json.load(sys.stdin)
started = time.time()
out = {"user": getpass.getuser(), "uid": os.getuid(), "home": os.path.expanduser("~")}
STATE = req.get("state_dir") or "STATE_DIR"

def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh), None
    except FileNotFoundError:
        return None, f"{path} is missing"
    except (OSError, ValueError) as exc:
        return None, f"{path}: {exc}"

out["provisioned"], out["provisioned_error"] = read_json(STATE + "/fingerprint.json")
env, out["python_env_error"] = read_json(STATE + "/python_env.json")
out["python_env"] = env
cluster_env = {}
try:
    for line in open(STATE + "/cluster.env"):
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, _, v = line.partition("=")
            cluster_env[k.strip()] = v.strip().strip('"')
except OSError:
    pass
out["cluster_env"] = cluster_env

# The environment as it is now, from its metadata: nothing is imported.
fp = None
if env and env.get("prefix"):
    if os.path.isdir(env["prefix"]):
        try:
            fp = FP["fingerprint"](env["prefix"], env.get("python"), env.get("lock"))
        except Exception as exc:
            out["fingerprint_error"] = f"cannot read the environment {env['prefix']}: {exc}"
    else:
        out["fingerprint_error"] = f"the environment {env['prefix']} does not exist"
out["fingerprint"] = fp
gpus, source = FP["gpu_count"]()
out["gpu_count"], out["gpu_source"] = gpus, source

# torch: imported only when the environment (or driver, GPUs, libcuda) changed since the
# last successful check by this user on this node.
def libcuda():
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/lib"):
        p = os.path.join(d, "libcuda.so.1")
        if os.path.exists(p):
            return os.path.realpath(p)
    return None

torch = {"ok": False, "version": None, "gpus": 0, "cuda_available": False,
         "distributed": False, "error": None, "cached": False, "seconds": 0.0}
changed = bool(fp and out["provisioned"] and FP["changes"](out["provisioned"], fp))
if changed:  # refused for drift anyway: no need to spend seconds importing torch
    torch["skipped"] = "the environment changed since it was provisioned"
elif env and env.get("python") and fp:
    key = hashlib.sha256(
        json.dumps([fp["sha256"], env["python"], libcuda(), gpus]).encode()).hexdigest()
    cache_path = os.path.join(out["home"], "TORCH_CACHE")
    cache = read_json(cache_path)[0]
    cache = cache if isinstance(cache, dict) else {}
    if isinstance(cache.get(key), dict):
        torch.update(cache[key], cached=True)
    else:
        t0 = time.time()
        code = ("FP = {'__name__': 'clustertrain_fingerprint'}\n"
                "exec(compile(%r, 'fingerprint.py', 'exec'), FP)\n"
                "import json; print(json.dumps(FP['checks']()))" % FP_SOURCE)
        try:
            p = subprocess.run([env["python"], "-c", code], capture_output=True, text=True,
                               timeout=120)
            if p.returncode != 0:
                torch["error"] = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
            else:
                c = json.loads(p.stdout.strip().splitlines()[-1])
                if c["torch_import"] != "ok":
                    torch["error"] = c["torch_import"]
                else:
                    result = {"ok": True, "version": c["version"], "gpus": c["gpu_count"],
                              "cuda_available": c["cuda_available"],
                              "distributed": c["distributed"], "nccl": c["nccl"]}
                    torch.update(result)
                    try:  # keep the newest few results, private to this user
                        os.makedirs(os.path.dirname(cache_path), mode=0o700, exist_ok=True)
                        keep = dict(list(cache.items())[-7:])
                        keep[key] = result
                        tmp = "%s.%d" % (cache_path, os.getpid())
                        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                        with open(os.open(tmp, flags, 0o600), "w") as fh:
                            json.dump(keep, fh)
                        os.replace(tmp, cache_path)
                    except OSError:
                        pass
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, KeyError) as exc:
            torch["error"] = str(exc)
        torch["seconds"] = round(time.time() - t0, 3)
elif not (env and env.get("python")):
    torch["error"] = out["python_env_error"] or "python_env.json has no 'python'"
else:
    torch["error"] = out.get("fingerprint_error") or "the environment cannot be read"
torch["torchrun"] = bool(env and env.get("torchrun")) and os.access(env["torchrun"], os.X_OK)
out["torch"] = torch

# The shared path: mounted as the inventory says, not empty, writable by this user.
def unescape(path):
    return (path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))

def mounts():
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) >= 5 and len(rest) >= 2:
                found.append((unescape(fields[4]), rest[0], rest[1]))
    return found

def check_shared(spec):
    path = spec["path"]
    res = {"ok": False, "kind": None, "error": None, "fstype": None}
    try:
        entries = os.listdir(path)  # first: an automount mounts now
    except OSError as exc:
        res.update(kind="missing", error=f"{path}: {exc.strerror}")
        return res
    real = os.path.realpath(path)
    try:
        table = mounts()
    except OSError as exc:
        res.update(kind="mountinfo", error=f"/proc/self/mountinfo: {exc.strerror}")
        return res
    here = [m for m in table if m[0] == real]
    if not here:
        under = max((m for m in table if real.startswith(m[0].rstrip("/") + "/")),
                    key=lambda m: len(m[0]), default=("/", "?", "?"))
        res.update(kind="not_mounted", error=f"{path} is not a mount point (it is a directory "
                   f"of {under[0]}, {under[1]}){' and it is empty' if not entries else ''}")
        return res
    mount_point, fstype, source = here[-1]  # the last one is on top (autofs, then nfs4)
    res["fstype"] = fstype
    if spec.get("fstypes") and fstype not in spec["fstypes"]:
        res.update(kind="wrong_type", error=f"{path} is a {fstype} mount of {source}, not "
                   f"{' or '.join(spec['fstypes'])} as the inventory says")
        return res
    if not entries:
        res.update(kind="empty", error=f"{path} is mounted ({fstype}, {source}) but empty: "
                   "not the cluster's share")
        return res
    checkpoints = os.path.join(path, "checkpoints")
    if not os.path.isdir(checkpoints):
        res.update(kind="no_checkpoints", error=f"{checkpoints} does not exist on the share "
                   f"({fstype}, {source}): not the cluster's share, or made without the "
                   "nfs_server role")
        return res
    mine = os.path.join(checkpoints, out["user"])
    probe = os.path.join(mine, ".clustertrain-probe-%s-%d" % (socket.gethostname(), os.getpid()))
    try:
        os.makedirs(mine, mode=0o700, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"clustertrain preflight\n")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        res.update(kind="not_writable", error=f"{mine} is not writable by {out['user']} "
                   f"(uid {out['uid']}): {exc.strerror}")
        return res
    if spec.get("token"):
        tok = spec["token"]
        try:
            fd = os.open(os.path.join(checkpoints, tok["name"]),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, tok["value"].encode())
            os.close(fd)
        except OSError as exc:
            res.update(kind="not_writable", error=f"{checkpoints} is not writable by "
                       f"{out['user']} (uid {out['uid']}): {exc.strerror}")
            return res
    res["ok"] = True
    return res

out["shared"] = check_shared(req["shared"])

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
            if (name.split(".")[1:2] == [out["user"]]
                    and time.time() - os.stat(path).st_mtime > LEASE_S):
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

# Node 0: a listener on the master port the job will use, until every node connected to
# it (or LISTEN_S). It greets with the nonce; the last expected node is greeted only
# after the listening socket is closed, so the port is free when preflight ends.
def serve(sock, spec, token_path):
    deadline, count = time.time() + spec["seconds"], 0
    greeting = ("clustertrain %s\n" % spec["nonce"]).encode()
    try:
        while count < spec["expect"] and time.time() < deadline:
            sock.settimeout(max(0.1, deadline - time.time()))
            try:
                conn, _ = sock.accept()
            except OSError:
                break
            last = count + 1 >= spec["expect"]
            if last:
                sock.close()
            said = b""
            try:  # the client closes first: no TIME_WAIT is left on this side of the port
                conn.settimeout(2.0)
                conn.sendall(greeting)
                while True:
                    part = conn.recv(64)
                    if not part:
                        break
                    said += part
            except OSError:
                pass
            finally:
                conn.close()
            if said.startswith(b"stop " + spec["nonce"].encode()):
                break
            count += 1
    finally:
        sock.close()
        if token_path:
            try:
                os.unlink(token_path)
            except OSError:
                pass

listen = req.get("listen")
token = req["shared"].get("token")
token_path = (os.path.join(req["shared"]["path"], "checkpoints", token["name"])
              if token and out["shared"]["ok"] else None)
if listen and (out.get("port_free") or (out.get("free_port") and not req.get("strict"))):
    lport = req["port"] if out["port_free"] else out["free_port"]
    info = {"port": lport, "ok": False, "error": None, "self": None}
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", lport))
        sock.listen(128)
        info["ok"] = True
    except OSError as exc:
        info["error"] = f"cannot listen on port {lport}: {exc.strerror}"
        sock.close()
    if info["ok"]:
        sys.stdout.flush()
        if os.fork() == 0:  # the listener outlives this probe, detached from the session
            try:
                os.setsid()
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                serve(sock, listen, token_path)
            finally:
                os._exit(0)
        sock.close()
        addr = resolve.get(listen["address"])
        if addr:  # node 0 itself reaches the master address too (torchrun's agent does)
            try:
                c = socket.create_connection((addr, lport), timeout=listen["timeout"])
                c.settimeout(listen["timeout"])
                ok = c.recv(64).strip() == ("clustertrain " + listen["nonce"]).encode()
                c.sendall(b"ok\n")
                c.close()
                info["self"] = {"ok": ok, "error": None if ok else "another program answers"}
            except OSError as exc:
                info["self"] = {"ok": False, "error": str(exc.strerror or exc)}
    out["listener"] = info
if token_path and not (out.get("listener") or {}).get("ok"):
    try:  # nobody will read it: no listener, so no second round
        os.unlink(token_path)
    except OSError:
        pass
out["seconds"] = round(time.time() - started, 3)
out["time"] = time.time()
print(json.dumps(out))
'''

# Round 2, on every node but node 0.
REACH_SCRIPT = r'''
import json, socket, sys, time
req = json.load(sys.stdin)
out = {}
tok = req.get("token")
if tok:  # before connecting: the listener removes the token once all nodes connected
    try:
        with open(tok["path"]) as fh:
            seen = fh.read()
        out["token"] = {"ok": seen == tok["value"], "error": None if seen == tok["value"]
                        else "it holds something else"}
    except OSError as exc:
        out["token"] = {"ok": False, "error": exc.strerror or str(exc)}
t0 = time.time()
try:
    s = socket.create_connection((req["addr"], req["port"]), timeout=req["timeout"])
    s.settimeout(req["timeout"])
    said = s.recv(64)
    ok = said.strip() == ("clustertrain " + req["nonce"]).encode()
    s.sendall(b"ok\n")
    s.close()
    out["connect"] = {"ok": ok,
                      "error": None if ok else "another program answers there (%r)" % said[:40]}
except socket.timeout:
    out["connect"] = {"ok": False, "error": "no answer within %g s (packets dropped: a firewall?)"
                                           % req["timeout"]}
except OSError as exc:
    out["connect"] = {"ok": False, "error": exc.strerror or str(exc)}
out["seconds"] = round(time.time() - t0, 3)
print(json.dumps(out))
'''

STOP_SCRIPT = r'''
import socket, sys
port, nonce = int(sys.argv[1]), sys.argv[2]
try:
    s = socket.create_connection(("127.0.0.1", port), timeout=3)
    s.settimeout(3)
    if s.recv(64).strip() == ("clustertrain " + nonce).encode():
        s.sendall(("stop " + nonce + "\n").encode())
    s.close()
except OSError:
    pass
'''


def _script() -> str:
    source = project().fingerprint_py.read_text()
    return ("FP_SOURCE = %r\nFP = {'__name__': 'clustertrain_fingerprint'}\n"
            "exec(compile(FP_SOURCE, 'fingerprint.py', 'exec'), FP)\n" % source
            + _PROBE_BODY.replace('"LEASE_DIR"', repr(LEASE_DIR))
            .replace('"STATE_DIR"', repr(STATE_DIR)).replace('"TORCH_CACHE"', repr(TORCH_CACHE)))


PROBE_SCRIPT = _script()


@dataclass
class NodeFacts:
    """What preflight learned about one node (error set when SSH itself failed)."""

    node: NodeSpec
    error: str | None = None
    user: str | None = None          # who the job runs as on this node
    uid: int | None = None
    home: str | None = None
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
