"""The node side of preflight: what each node answers about itself, in JSON (`node.py
probe|reach|unlisten|release`), in the node's system python.

    probe     round 1, a JSON request on stdin: who the job runs as, the environment now
              (fingerprint.py) and as provisioned, torch (imported only when the
              environment changed since this user last checked it, see TORCH_CACHE),
              GPUs, who else uses this node (busy.py: live runs of any user, GPU
              processes), the shared path, names; on node 0 the master port (claimed
              for the run, in root's claims directory: claims_dir) and a short-lived
              listener on it, which counts only nodes that prove the run's key (serve)
    reach     round 2, on every other node: node 0's token on the share, its listener
              (done at the end of round 1 where node 0 listens on the port asked for:
              reach_ahead; asked again only where it could not be)
    unlisten  PORT NONCE: end node 0's listener now (the run's key on stdin; preflight
              asks `reach` with "stop" instead, which answers who else connected)
    release   RUN: drop the run's claim on node 0's master port
"""

from __future__ import annotations

import errno
import getpass
import glob
import hashlib
import hmac
import json
import os
import pwd
import secrets
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from . import busy, cordon, fingerprint as fp, health
from .protocol import BOUND_WAIT, EXIT_FILE, JOBS_DIR, LAST_USED, PORT_CLAIMS_DIR
from .space import space, temp_dir
from .util import read_json_or_why, write_json

# Master-port claims on node 0, shared by every user of the node (see claim()).
LEASE_DIR = PORT_CLAIMS_DIR
LEASE_S = 120  # a claim lives this long: by then the job's TCPStore holds the port itself
# Another user's claims count for at most this many ports (see live_claims).
MAX_CLAIMS = 8
# Under checkpoints/<user>/ on the share: where the user's runs keep their states
# (record/rundir.py run_state_dir).
SHARE_STATE = (".clustertrain", "runs")
# Per user on each node: the result of the last torch import, keyed by the live fingerprint.
TORCH_CACHE = ".cache/clustertrain/torch-check.json"
LIBCUDA_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu",
                "/usr/lib")


# --- files the roles wrote --------------------------------------------------------------

def read_cluster_env(path: str) -> dict[str, str]:
    """The common role's cluster.env (KEY=VALUE lines); {} if it cannot be read."""
    found = {}
    try:
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    k, _, v = line.partition("=")
                    found[k.strip()] = v.strip().strip('"')
    except OSError:
        pass
    return found


def live_fingerprint(env: dict | None) -> tuple[dict | None, str | None]:
    """The environment as it is now, from its metadata (nothing is imported)."""
    if not (env and env.get("prefix")):
        return None, None
    if not os.path.isdir(env["prefix"]):
        return None, f"the environment {env['prefix']} does not exist"
    try:
        return fp.fingerprint(env["prefix"], env.get("python"), env.get("lock")), None
    except Exception as exc:  # noqa: BLE001 - any unreadable metadata is reported
        return None, f"cannot read the environment {env['prefix']}: {exc}"


# --- torch, imported only when the environment changed ----------------------------------

def libcuda() -> str | None:
    for d in LIBCUDA_DIRS:
        p = os.path.join(d, "libcuda.so.1")
        if os.path.exists(p):
            return os.path.realpath(p)
    return None


def import_torch(python: str) -> tuple[dict | None, str | None]:
    """fingerprint.py's checks() in the environment's python (`node.py torch`, from this
    package's own directory): (result, None) or (None, why)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        p = subprocess.run([python, "-m", "orchestrator.node", "torch"], cwd=root,
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            return None, (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        c = json.loads(p.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return None, str(exc)
    if c.get("torch_import") != "ok":
        return None, c.get("torch_import")
    return {"ok": True, "version": c["version"], "gpus": c["gpu_count"],
            "cuda_available": c["cuda_available"], "distributed": c["distributed"],
            "nccl": c["nccl"]}, None


def check_torch(env: dict | None, live: dict | None, provisioned: dict | None, gpus: int,
                home: str,
                env_error: str | None) -> dict[str, Any]:
    """What torch says in the environment: from this user's cache while the environment,
    driver, GPUs and libcuda are as they were at the last import, else imported now."""
    torch: dict[str, Any] = {"ok": False, "version": None, "gpus": 0,
                             "cuda_available": False, "distributed": False, "error": None,
                             "cached": False, "seconds": 0.0}
    if live and provisioned and fp.changes(provisioned, live):
        # refused for drift anyway: no need to spend seconds importing torch
        torch["skipped"] = "the environment changed since it was provisioned"
    elif env and env.get("python") and live:
        key = hashlib.sha256(json.dumps([live["sha256"], env["python"], libcuda(),
                                         gpus]).encode()).hexdigest()
        cache_path = os.path.join(home, TORCH_CACHE)
        cache = read_json_or_why(cache_path)[0]
        cache = cache if isinstance(cache, dict) else {}
        if isinstance(cache.get(key), dict):
            torch.update(cache[key], cached=True)
        else:
            t0 = time.time()
            result, torch["error"] = import_torch(env["python"])
            if result is not None:
                torch.update(result)
                keep = dict(list(cache.items())[-7:])  # the newest few, private to the user
                keep[key] = result
                try:
                    os.makedirs(os.path.dirname(cache_path), mode=0o700, exist_ok=True)
                    write_json(cache_path, keep, sync=False)
                except OSError:
                    pass
            torch["seconds"] = round(time.time() - t0, 3)
    elif not (env and env.get("python")):
        torch["error"] = env_error or "python_env.json has no 'python'"
    else:
        torch["error"] = env_error or "the environment cannot be read"
    torch["torchrun"] = bool(env and env.get("torchrun")
                             and os.access(env["torchrun"], os.X_OK))
    return torch


# --- the shared path ----------------------------------------------------------------------

def unescape(path: str) -> str:
    """A path as /proc/self/mountinfo escapes it, unescaped."""
    return (path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))


def mounts(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[str, str, str]]:
    """(mount point, filesystem type, source) of every mount, in mount order."""
    found = []
    with open(mountinfo) as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) >= 5 and len(rest) >= 2:
                found.append((unescape(fields[4]), rest[0], rest[1]))
    return found


def own_places(mine: str) -> list[str]:
    """The places of a user's own on the share, from checkpoints/<user> (MINE) down to the
    directory of their runs' states (record/rundir.py run_state_dir): checkpoints, a run's
    records and, in a run's state, its secrets. Whoever may write one of them may read or
    replace what the user's runs keep below it."""
    return [mine, os.path.join(mine, SHARE_STATE[0]), os.path.join(mine, *SHARE_STATE)]


def owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def share_uid(checkpoints: str, mine: str, uid: int) -> int:
    """The owner the share gives a file this user makes: their own uid, or the anonymous
    uid where the share squashes it (root under root_squash, everyone under all_squash).
    Their place MINE owned by UID (not root) says so already; else a file made and removed
    again in CHECKPOINTS (sticky, writable by all) tells. (Under all_squash every file is
    the anonymous user's: such a share cannot tell users apart, and neither can not_own.)"""
    try:
        if uid != 0 and os.lstat(mine).st_uid == uid:
            return uid
    except OSError:
        return uid
    probe = os.path.join(checkpoints, ".clustertrain-owner-%s-%d" % (socket.gethostname(),
                                                                     os.getpid()))
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return uid
    try:
        return os.fstat(fd).st_uid
    finally:
        os.close(fd)
        _unlink(probe)


def not_own(places: list[str], user: str, uid: int) -> dict[str, str] | None:
    """The first of PLACES (made for USER, whose files the share gives uid UID) that is
    not USER's alone: a symbolic link or not a directory, another user's, or writable by
    its group or others; {kind, error, fix} naming it, its owner and what to do. A place
    that does not exist yet is fine: it is made by USER's runs, theirs. A squatted place
    (made by someone else before USER's first run) is refused, never used: its owner
    could read and replace USER's checkpoints and run records there."""
    for path in places:
        try:
            st = os.lstat(path)   # a link is judged itself, never followed
        except FileNotFoundError:
            return None
        except OSError as exc:
            return {"kind": "not_own", "error": f"{path}: {exc.strerror}",
                    "fix": f"{user} must own it, mode 0700: ask an admin to look at it"}
        owner = owner_name(st.st_uid)
        remove = (f"move it away (mv {path} {path}.old) and run again: the tool makes it "
                  "anew, mode 0700" if st.st_uid == uid else
                  f"ask {'an admin' if st.st_uid == 0 else owner + ' or an admin'} to remove "
                  f"it (sudo rm -rf {path}), then run again: the tool makes it anew, "
                  f"{user}'s own, mode 0700")
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            what = (f"a symbolic link (to {os.readlink(path)})" if stat.S_ISLNK(st.st_mode)
                    else "not a directory")
            return {"kind": "not_own", "error": f"{path} is {what}, made by {owner}, not a "
                    f"directory of {user}'s own", "fix": remove}
        if st.st_uid != uid:
            return {"kind": "not_own", "error": f"{path} belongs to {owner}, not to {user}: "
                    f"{owner} could read and replace what {user}'s runs keep there",
                    "fix": remove}
        if st.st_mode & 0o022:
            who = {0o020: "its group", 0o002: "others"}.get(st.st_mode & 0o022,
                                                            "its group and others")
            return {"kind": "open", "error": f"{path} is writable by {who} (mode "
                    f"{st.st_mode & 0o7777:04o}): they could replace what {user}'s runs "
                    "keep there", "fix": f"chmod go-w {path} (and check what is in it)"}
    return None


def _unwritable(exc: OSError) -> str:
    """Why a place on the share cannot be written: it is full (or the user's quota is), or
    its owner or mode forbids it."""
    return "full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "not_writable"


def check_shared(spec: dict, user: str, uid: int) -> dict[str, Any]:
    """The shared path: mounted as the inventory says (SPEC: path, fstypes), not empty,
    holding checkpoints/, where this user's own places (made now if missing) are theirs
    alone (not_own) and writable; with SPEC's token, node 0's token is written there for
    the others to read."""
    path = spec["path"]
    res: dict[str, Any] = {"ok": False, "kind": None, "error": None, "fstype": None}
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
    fstype, source = here[-1][1:]  # the last one is on top (autofs, then nfs4)
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
    mine = os.path.join(checkpoints, user)
    try:
        os.mkdir(mine, 0o700)   # the user's own place, made for them on first use
    except FileExistsError:
        pass                    # theirs already, or taken first by someone else: below
    except OSError as exc:
        res.update(kind=_unwritable(exc), error=f"{checkpoints} is not writable by {user} "
                   f"(uid {uid}): {exc.strerror}")
        return res
    taken = not_own(own_places(mine), user, share_uid(checkpoints, mine, uid))
    if taken:
        res.update(taken)
        return res
    probe = os.path.join(mine, ".clustertrain-probe-%s-%d" % (socket.gethostname(), os.getpid()))
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"clustertrain preflight\n")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        res.update(kind=_unwritable(exc), error=f"{mine} is not writable by {user} "
                   f"(uid {uid}): {exc.strerror}")
        return res
    if spec.get("token"):
        tok = spec["token"]
        try:
            fd = os.open(os.path.join(checkpoints, tok["name"]),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, tok["value"].encode())
            os.close(fd)
        except OSError as exc:
            res.update(kind=_unwritable(exc), error=f"{checkpoints} is not writable by "
                       f"{user} (uid {uid}): {exc.strerror}")
            return res
    res["ok"] = True
    return res


# --- the master port: free, and claimed for one launch ----------------------------------

def port_free(port: int) -> bool:
    """Bindable with SO_REUSEADDR as torch's TCPStore binds: a listener makes the port
    taken, sockets left in TIME_WAIT by the previous run's connections do not."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


@dataclass(frozen=True)
class Claim:
    """A claim of PORT for USER's run RUN: the file LEASES/<port>.<user>.<run>, made at
    MADE_NS (its mtime)."""

    port: int
    user: str
    run: str
    made_ns: int
    name: str


def claimer() -> str:
    """The name claims of this process carry: its user's, from its uid (not from the
    environment, which the user sets), as live_claims reads a claim file's owner."""
    return owner_name(os.geteuid())


def parse_claim(name: str, owner: str) -> tuple[int, str] | None:
    """A claim file's port and run: `<port>.<user>.<run>`, the user the file's OWNER (a run
    id may hold dots: a recovery's RUN.r1; so may a user's name)."""
    port, _, rest = name.partition(".")
    if not port.isdigit() or not rest:
        return None
    mine = f"{owner}."
    return int(port), rest[len(mine):] if rest.startswith(mine) else rest


def live_claims(me: str, leases: str = LEASE_DIR) -> list[Claim]:
    """The claims in LEASES that count for ME, oldest first. A claim is its file owner's,
    whatever its name says (nobody claims in another's name: bob's file 29500.alice.x is
    bob's claim), and counts
    - only while it is fresh: made within the last LEASE_S (a launch's claim is needed that
      long at most, and a launch that ended dropped it; a time ahead of now is no claim);
    - of another user, only among that user's MAX_CLAIMS oldest.
    A claim proves no more than that its owner made it lately: the launch that made it runs
    on another machine, and no process of it on this node could vouch for it. So instead of
    judging claims one by one, the rule bounds what one user's claims take from the others:
    junk (or many launches at once) blocks every port of the range for its own user, and at
    most MAX_CLAIMS ports for anyone else, who then takes a port further on. (A user can
    hold ports by listening on them too; claims give nobody more than that.)"""
    now, found, owners = time.time(), [], {}
    for name in os.listdir(leases):
        try:
            st = os.lstat(os.path.join(leases, name))
        except OSError:
            continue
        if st.st_uid not in owners:
            owners[st.st_uid] = owner_name(st.st_uid)
        user = owners[st.st_uid]
        parsed = parse_claim(name, user)
        if parsed is not None and stat.S_ISREG(st.st_mode) \
                and -1.0 < now - st.st_mtime < LEASE_S:
            found.append(Claim(parsed[0], user, parsed[1], st.st_mtime_ns, name))
    found.sort(key=lambda c: (c.made_ns, c.name))
    kept: dict[str, int] = {}
    counted = []
    for c in found:
        kept[c.user] = kept.get(c.user, 0) + 1
        if c.user == me or kept[c.user] <= MAX_CLAIMS:
            counted.append(c)
    return counted


def claims(port: int, leases: str = LEASE_DIR) -> list[Claim]:
    """The claims of PORT that count for this process's user (live_claims), oldest first."""
    return [c for c in live_claims(claimer(), leases) if c.port == port]


def claim(port: int, run: str | None, leases: str = LEASE_DIR) -> bool:
    """Two launches (any users) that probe at the same moment must not both take one port
    before either torchrun listens on it. A launch claims a free port with a file
    LEASES/<port>.<user>.<run> (a directory like /tmp: every user may add, nobody may
    remove another's); the oldest claim that counts (live_claims) wins, the others try
    the next port. Without RUN (preflight alone) nothing is claimed: True if it could be."""
    if not port_free(port) or claims(port, leases):
        return False
    if not run:
        return True
    mine = os.path.join(leases, f"{port}.{claimer()}.{run}")
    try:
        os.close(os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    found = claims(port, leases)
    if found and found[0].name == os.path.basename(mine):
        return True
    _unlink(mine)
    return False


def has_acl(path: str) -> bool:
    """Whether PATH carries a POSIX ACL (access or default), which its mode does not show."""
    for name in ("system.posix_acl_access", "system.posix_acl_default"):
        try:
            if os.getxattr(path, name, follow_symlinks=False):
                return True
        except OSError:
            continue   # ENODATA: none; ENOTSUP: the filesystem has none
    return False


def claims_dir(leases: str) -> str | None:
    """Why LEASES cannot hold the claims of every user (None: it can). It must be root's
    (the common role makes it at boot: tmpfiles.d), like /tmp (sticky, writable by all)
    and without an ACL: a directory another user made decides nothing for this one (its
    maker could deny this user in an ACL while its mode reads 1777). Root makes it now
    when missing; a user never does (it would be that user's)."""
    if os.geteuid() == 0:
        try:
            os.mkdir(leases, 0o1777)
            os.chmod(leases, 0o1777)    # made now, under the umask
        except FileExistsError:
            pass
    fix = f"ask an admin to remove it (sudo rm -rf {leases}); site.yml makes it, root's, at boot"
    try:
        st = os.lstat(leases)
    except FileNotFoundError:
        return f"{leases} does not exist: ask an admin to run site.yml (its common role " \
            "makes it, root's, at boot)"
    owner = owner_name(st.st_uid)
    if not stat.S_ISDIR(st.st_mode) or st.st_mode & 0o7777 != 0o1777:
        what = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
                if not stat.S_ISDIR(st.st_mode) else f"mode {st.st_mode & 0o7777:04o}, not 1777")
        return (f"{leases} is {what} (made by {owner}): ask "
                f"{'an admin' if st.st_uid == 0 else owner + ' or an admin'} to remove it "
                f"(sudo rm -rf {leases})")
    if st.st_uid != 0:
        return f"{leases} is not root's (made by {owner}): {fix}"
    if has_acl(leases):
        return f"{leases} carries an ACL (getfacl {leases}): {fix}"
    return None


def drop_expired(leases: str) -> None:
    """Remove this user's own claims that lapsed (those of others are theirs to remove)."""
    me, uid, now = claimer(), os.geteuid(), time.time()
    for name in os.listdir(leases):
        if parse_claim(name, me) is None:
            continue
        try:
            st = os.lstat(os.path.join(leases, name))
            if st.st_uid == uid and now - st.st_mtime > LEASE_S:
                os.unlink(os.path.join(leases, name))
        except OSError:
            continue


def find_port(port: int, run: str | None, span: int,
              leases: str = LEASE_DIR) -> dict[str, Any]:
    """{"port_free": PORT claimed, "free_port": it or the next one claimed (None: none of
    the SPAN ports from PORT up: the cluster's rendezvous ports)}; with "port_warning"
    when LEASES cannot hold claims (claims_dir): the ports are then found free but not
    claimed; {"port_error"} when nothing could be checked."""
    try:
        unusable = claims_dir(leases)
        if unusable:
            found = next((p for p in range(port, port + span) if port_free(p)), None)
            return {"port_free": found == port, "free_port": found,
                    "port_warning": "launches cannot claim their master port here (two at "
                                    f"the same moment could take the same one): {unusable}"}
        drop_expired(leases)
        taken = {c.port for c in live_claims(claimer(), leases)}
        free = port not in taken and claim(port, run, leases)
        return {"port_free": free, "free_port": port if free else next(
            (p for p in range(port + 1, port + span)
             if p not in taken and claim(p, run, leases)), None)}
    except OSError as exc:
        return {"port_free": False, "free_port": None, "port_error": str(exc)}


def resolve(names: list[str]) -> dict[str, str | None]:
    """Each name's IPv4 address as this node resolves it (None: it does not)."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = str(socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0])
        except OSError:
            found[name] = None
    return found


# --- node 0's listener on the master port -----------------------------------------------
# Any user of node 0 may connect to the listener, so nothing it says is a secret: it greets
# each connection with "clustertrain NONCE CHALLENGE" (the preflight's nonce, public: it
# names the token file on the share; a fresh random challenge). A node of the run answers
# "ok PROOF" (count me) or "stop PROOF" (end now), PROOF the HMAC-SHA256 of "WORD NONCE
# CHALLENGE" under the run's key, which reaches the run's processes only on their standard
# input (never a command line, an environment or the share): nobody else can make it, and
# an answer overheard proves nothing to the next challenge. The listener replies "counted
# STRANGERS": the connections it had that could not prove the key (JSON), which preflight
# names instead of blaming the share or a firewall.

GREETING = "clustertrain"
ANSWER_WAIT = 2.0    # seconds the listener waits for a connection's answer
MAX_STRANGERS = 4    # connections without the key that the listener names
MAX_LINE = 4096


def proof(key: str, word: str, nonce: str, challenge: str) -> str:
    """WORD's proof, under the run's KEY, for the listener of NONCE that sent CHALLENGE."""
    return hmac.new(key.encode(), f"{word} {nonce} {challenge}".encode(),
                    hashlib.sha256).hexdigest()


def read_line(conn: socket.socket) -> bytes:
    """One line from CONN (without its end), or what came before it closed."""
    said = b""
    while b"\n" not in said and len(said) < MAX_LINE:
        part = conn.recv(MAX_LINE)
        if not part:
            break
        said += part
    return said.partition(b"\n")[0]


def hear(conn: socket.socket, peer: str, spec: dict, strangers: list[dict[str, str]]
         ) -> str | None:
    """Greet CONN and read its answer: "ok" or "stop" when it proved the run's key (SPEC's);
    else None, and a connection that said something else, or held on without a word, is
    added to STRANGERS (one that closes at once is another preflight's node, or a scan)."""
    challenge = secrets.token_hex(16)
    said, held = b"", False
    try:
        conn.settimeout(ANSWER_WAIT)
        conn.sendall(f"{GREETING} {spec['nonce']} {challenge}\n".encode())
        said = read_line(conn)
    except OSError:
        held = True
    word, _, mac = said.decode("ascii", "replace").strip().partition(" ")
    if word in ("ok", "stop") and hmac.compare_digest(
            mac.encode(), proof(spec["key"], word, spec["nonce"], challenge).encode()):
        return word
    if (said or held) and len(strangers) < MAX_STRANGERS:
        strangers.append({"addr": peer, "said": said[:40].decode("ascii", "replace")
                          if said else "nothing, and held on"})
    return None


def serve(sock: socket.socket, spec: dict, token_path: str | None) -> None:
    """Accept until SPEC's expected number of nodes proved the run's key (hear()), one
    proved a stop, or SPEC's seconds ran out; then remove the token. The listening socket
    is closed before the last node is answered, so the port is free when preflight ends;
    a node closes its end first, so no TIME_WAIT is left on this side of the port. Another
    user's preflight, whose nodes try the same port at once (round 2 ahead), closes without
    a word and is not counted; nor is anyone who cannot prove the key."""
    deadline, count = time.time() + spec["seconds"], 0
    strangers: list[dict[str, str]] = []
    try:
        while count < spec["expect"] and time.time() < deadline:
            sock.settimeout(max(0.1, deadline - time.time()))
            try:
                conn, peer = sock.accept()
            except OSError:
                break
            word = None
            try:
                word = hear(conn, peer[0], spec, strangers)
                count += word == "ok"
                if word == "stop" or count >= spec["expect"]:
                    sock.close()
                if word:
                    conn.sendall(f"counted {json.dumps(strangers)}\n".encode())
                    while conn.recv(64):
                        pass
            except OSError:
                pass
            finally:
                conn.close()
            if word == "stop":
                break
    finally:
        sock.close()
        _unlink(token_path)


def greeting(conn: socket.socket, nonce: str) -> tuple[bytes, str | None]:
    """What the program at CONN's other end greeted with, and its challenge when it is the
    listener of NONCE (None: another program, or another preflight's listener)."""
    said = read_line(conn)
    parts = said.decode("ascii", "replace").split()
    return said, parts[2] if len(parts) == 3 and parts[:2] == [GREETING, nonce] else None


def prove(conn: socket.socket, word: str, nonce: str, key: str,
          challenge: str) -> list[dict[str, str]] | None:
    """Answer the listener's CHALLENGE with WORD, proved with the run's KEY: the strangers
    its reply names (None: it did not take the proof)."""
    conn.sendall(f"{word} {proof(key, word, nonce, challenge)}\n".encode())
    kind, _, rest = read_line(conn).decode("ascii", "replace").partition(" ")
    if kind != "counted":
        return None
    try:
        found = json.loads(rest)
    except ValueError:
        return []
    return [s for s in found if isinstance(s, dict)] if isinstance(found, list) else []


def greeted(addr: str, port: int, nonce: str, key: str, timeout: float
            ) -> tuple[bool, bytes, list[dict[str, str]]]:
    """Connect to the listener at ADDR:PORT: (it is NONCE's and counted this node, what it
    said, the strangers it named)."""
    c = socket.create_connection((addr, port), timeout=timeout)
    try:
        c.settimeout(timeout)
        said, challenge = greeting(c, nonce)
        # another's is left without a word
        counted = prove(c, "ok", nonce, key, challenge) if challenge else None
    finally:
        c.close()
    return counted is not None, said, counted or []


def listen(port: int, spec: dict, token_path: str | None,
           master_ip: str | None) -> dict[str, Any]:
    """Listen on PORT in a process of its own that outlives this probe (serve()); then,
    with MASTER_IP, check that this node reaches it there too (torchrun's agent does)."""
    info: dict[str, Any] = {"port": port, "ok": False, "error": None, "self": None}
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        info["error"] = f"cannot listen on port {port}: {exc.strerror}"
        return info
    info["ok"] = True
    sys.stdout.flush()
    if os.fork() == 0:  # the listener, detached from the session
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            serve(sock, spec, token_path)
        finally:
            os._exit(0)
    sock.close()
    if master_ip:
        try:
            ok = greeted(master_ip, port, spec["nonce"], spec["key"], spec["timeout"])[0]
            info["self"] = {"ok": ok, "error": None if ok else "another program answers"}
        except OSError as exc:
            info["self"] = {"ok": False, "error": str(exc.strerror or exc)}
    return info


def _touch(path: str) -> None:
    try:
        with open(path, "a"):
            os.utime(path)
    except OSError:
        pass   # a read-only home: the environment still runs


def _unlink(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


# --- the verbs ----------------------------------------------------------------------------

def machine() -> dict[str, str]:
    """What tells this machine from another: its host name, machine id, boot id (one per
    running kernel) and SSH host keys. Two inventory hosts that answer with all of them
    equal are one machine; cloned servers share a machine id (or host keys) but never a
    boot id, containers on one host share a boot id but not their host keys."""
    def read(path: str) -> str:
        try:
            with open(path) as fh:
                return fh.read().strip()
        except OSError:
            return ""
    keys = sorted(read(p).split(" ")[1] if " " in read(p) else read(p)
                  for p in glob.glob("/etc/ssh/ssh_host_*_key.pub"))
    return {"hostname": socket.gethostname(), "machine_id": read("/etc/machine-id"),
            "boot_id": read("/proc/sys/kernel/random/boot_id"),
            "host_keys": hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]}


def probe(req: dict) -> dict[str, Any]:
    """Round 1 (see the module's docstring). REQ: shared, addresses, port, run, strict,
    state_dir (where the python_env role wrote its files; user_env: a user's own
    environment there), and on node 0 listen."""
    started = time.time()
    out: dict[str, Any] = {"user": getpass.getuser(), "uid": os.getuid(),
                           "home": os.path.expanduser("~"), "machine": machine()}
    # Where the python_env role wrote its files: the cluster's, or a user's own environment
    # (~/.clustertrain/envs/NAME: the newest of that name, pinned here for the run).
    state = os.path.realpath(os.path.expanduser(req["state_dir"])) if req.get("state_dir") else ""
    if req.get("user_env") and os.path.isdir(state):
        out["env_dir"] = state
        _touch(os.path.join(state, LAST_USED))   # `env list` shows when it was last used
    out["provisioned"], out["provisioned_error"] = read_json_or_why(state + "/fingerprint.json")
    env, out["python_env_error"] = read_json_or_why(state + "/python_env.json")
    out["python_env"] = env
    out["cluster_env"] = read_cluster_env(state + "/cluster.env")
    live, error = live_fingerprint(env)
    out["fingerprint"] = live
    if error:
        out["fingerprint_error"] = error
    out["gpu_count"], out["gpu_source"] = fp.gpu_count()
    out["torch"] = check_torch(
        env, live, out["provisioned"], out["gpu_count"], out["home"],
        out["python_env_error"] if not (env and env.get("python"))
        else out.get("fingerprint_error"))
    out["busy"] = busy.scan(exclude=req.get("run")).to_json()  # after torch's import
    out["shared"] = check_shared(req["shared"], out["user"], out["uid"])
    readable = out["shared"]["ok"] or out["shared"]["kind"] == "full"
    out["space"] = space({**({"share": req["shared"]["path"]} if readable else {}),
                          "home": out["home"], "tmp": temp_dir()})
    if readable:   # who fills it, counted by its server while it is nearly full
        out["share_users"] = health.read_users(req["shared"]["path"])
    verdict = health.read_state()   # the health timer's, on the node's own disk (roles/health)
    if verdict and verdict.get("failing"):
        out["health"] = verdict
    if verdict and verdict.get("warnings"):   # a local disk users' temporary files fill
        out["health_warnings"] = [w.get("why") for w in verdict["warnings"]
                                  if isinstance(w, dict)]
    if out["shared"]["ok"] and req.get("node"):
        out["cordon"] = cordon.current(req["shared"]["path"], req["node"],
                                       req.get("admin_group") or cordon.DEFAULT_ADMIN_GROUP)
    if req.get("port"):
        out.update(find_port(req["port"], req.get("run"), int(req["span"])))
    out["resolve"] = resolve(req.get("addresses", []))
    spec = req.get("listen")
    token = req["shared"].get("token")
    token_path = (os.path.join(req["shared"]["path"], "checkpoints", token["name"])
                  if token and out["shared"]["ok"] else None)
    if spec and (out.get("port_free") or (out.get("free_port") and not req.get("strict"))):
        port = req["port"] if out["port_free"] else out["free_port"]
        out["listener"] = listen(port, spec, token_path, out["resolve"].get(spec["address"]))
    if not (out.get("listener") or {}).get("ok"):
        _unlink(token_path)  # nobody will read it: no listener, so no second round
    if req.get("reach"):   # a node but node 0: its round 2, ahead
        out["reach"] = reach_ahead(req["reach"], out["resolve"].get(req["reach"]["address"]))
    out["seconds"] = round(time.time() - started, 3)
    out["time"] = time.time()
    return out


def read_token(tok: dict) -> dict[str, Any]:
    """Whether node 0's token TOK ({path, value}) is on this node's share, holding it."""
    try:
        with open(tok["path"]) as fh:
            seen = fh.read()
    except OSError as exc:
        return {"ok": False, "error": exc.strerror or str(exc)}
    return {"ok": seen == tok["value"], "error": None if seen == tok["value"]
            else "it holds something else"}


def reach_ahead(req: dict, addr: str | None) -> dict[str, Any] | None:
    """Round 2's check done at the end of round 1, while node 0 comes to listen: connect
    to ADDR (node 0's address as this node resolves it) at the requested port until its
    listener greets (refused meanwhile), and read its token while the connection holds it
    there (the listener removes it once the last node has closed). None when node 0 did
    not listen there within REQ's wait (it chose another port, or failed): round 2 then
    asks this node again. REQ: port, nonce, key, timeout, wait, token."""
    if not addr:
        return None
    t0 = time.time()
    deadline = t0 + req["wait"]
    while True:
        try:
            c = socket.create_connection((addr, req["port"]), timeout=req["timeout"])
            break
        except ConnectionRefusedError:
            if time.time() >= deadline:
                return None
            time.sleep(0.02)
        except socket.timeout:  # noqa: UP041 - not TimeoutError before Python 3.10
            # packets dropped: said as round 2 says it (used if node 0 listens on this port)
            return {"addr": addr, "port": req["port"], "token": read_token(req["token"]),
                    "connect": {"ok": False, "error": "no answer within %g s (packets "
                                "dropped: a firewall?)" % req["timeout"]},
                    "seconds": round(time.time() - t0, 3)}
        except OSError:
            return None   # round 2 says why, with node 0's port
    out: dict[str, Any] = {"addr": addr, "port": req["port"]}
    try:
        c.settimeout(req["timeout"])
        challenge = greeting(c, req["nonce"])[1]
        if not challenge:
            return None   # another program holds the port: node 0 chose another
        out["token"] = read_token(req["token"])
        strangers = prove(c, "ok", req["nonce"], req["key"], challenge)
        out["connect"] = {"ok": strangers is not None, "error": None if strangers is not None
                          else "node 0's listener did not take the run's key"}
        out["strangers"] = strangers or []
    except OSError as exc:   # node 0's listener counted this connection: no second try
        out["connect"] = {"ok": False, "error": exc.strerror or str(exc)}
    finally:
        c.close()
    out["seconds"] = round(time.time() - t0, 3)
    return out


def reach(req: dict) -> dict[str, Any]:
    """Round 2 (see the module's docstring). REQ: addr, port, nonce, key, timeout, token;
    with "stop" (on node 0), end its listener instead (stop_listener)."""
    if req.get("stop"):
        return stop_listener(req["port"], req["nonce"], req["key"])
    out: dict[str, Any] = {}
    tok = req.get("token")
    if tok:  # before connecting: the listener removes the token once all nodes connected
        out["token"] = read_token(tok)
    t0 = time.time()
    try:
        ok, said, out["strangers"] = greeted(req["addr"], req["port"], req["nonce"],
                                             req["key"], req["timeout"])
        out["connect"] = {"ok": ok, "error": None if ok else
                          "another program answers there (%r)" % said[:40]}
    except socket.timeout:  # noqa: UP041 - not TimeoutError before Python 3.10
        out["connect"] = {"ok": False, "error": "no answer within %g s (packets dropped: a "
                                                "firewall?)" % req["timeout"]}
    except OSError as exc:
        out["connect"] = {"ok": False, "error": exc.strerror or str(exc)}
    out["seconds"] = round(time.time() - t0, 3)
    return out


def stop_listener(port: int, nonce: str, key: str | None = None) -> dict[str, Any]:
    """End node 0's listener on PORT now, if it is NONCE's, proving the run's KEY (None:
    read from standard input, {"key": KEY}, as `node.py unlisten PORT NONCE` gets it:
    never on a command line). {"stopped", "strangers": who connected without the key}."""
    if key is None:
        try:
            key = str(json.load(sys.stdin)["key"])
        except (ValueError, KeyError, TypeError):
            return {"stopped": False, "strangers": []}
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=3)
    except OSError:
        return {"stopped": False, "strangers": []}
    try:
        s.settimeout(3)
        challenge = greeting(s, nonce)[1]
        strangers = prove(s, "stop", nonce, key, challenge) if challenge else None
    except OSError:
        strangers = None
    finally:
        s.close()
    return {"stopped": strangers is not None, "strangers": strangers or []}


def release(run: str, leases: str = LEASE_DIR, once_bound: int | None = None,
            wait: float = BOUND_WAIT) -> None:
    """Drop RUN's claims on master ports, this user's files (a claim lapses by itself
    after LEASE_S); with
    ONCE_BOUND, first wait (at most WAIT seconds) until that port is bound."""
    deadline = time.monotonic() + wait
    ended = os.path.join(os.path.expanduser("~"), JOBS_DIR, run, EXIT_FILE)
    while (once_bound and port_free(once_bound) and not os.path.exists(ended)
           and time.monotonic() < deadline):
        time.sleep(0.2)
    for name in glob.glob(os.path.join(leases, "*." + run)):
        try:   # this user's own claims only: another's file named so is not RUN's claim
            if os.lstat(name).st_uid == os.geteuid():
                os.unlink(name)
        except OSError:
            pass
