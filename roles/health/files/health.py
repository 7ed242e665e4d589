"""The node's health check, run as root by a systemd timer on every training node
(roles/health: clustertrain-health.timer), as Slurm sites run NHC: a node that fails it is
cordoned with the reason, the same check passing again lifts the cordon it made, and every
change goes into the node's history on the share, which `clustertrain nodes` reads.

What it checks (each a Failure naming what and the fix):
- share:  the share answers (statvfs and a listing, in a child process given
          share_timeout seconds: a stalled NFS mount blocks whoever touches it) and is
          mounted;
- space:  free space and inodes on the share, / , /tmp and /home, against min_free_gb and
          min_free_inodes (the inventory's cluster_min_free_gb, which preflight refuses
          a run below);
- gpu:    nvidia-smi answers (a GPU fallen off the bus makes it fail), no uncorrected ECC
          error since the driver loaded, no retired page or row remap pending or failed;
          the kernel's Xid messages of the GPUs since the last check (those that mean a
          broken GPU keep the node cordoned until it reboots, or an admin lifts the
          cordon). Skipped on a node without nvidia-smi;
- clock:  chrony's offset from its sources below max_clock_offset seconds (when chrony
          runs and is synchronised);
- memory: no uncorrected memory error counted by the kernel's EDAC;
- maintenance: a reboot asked of the node and not yet done (`--defer-reboot WHY`, which
          roles/nvidia_driver runs when a new kernel module waits for a reboot and the node
          has work on it). The node is cordoned like a failing one; once nothing runs on it
          (no Slurm job, no process on a GPU, no run's supervisor) a check reboots it, and
          the first check after the reboot returns it.

What it does with the verdict, each step bounded in time so that a stalled share never
hangs the timer:
- its state, on the node's own disk (STATE_DIR/state.json, readable by every user: the
  preflight probe reads it, so a node whose share stalls is refused naming the check);
- Slurm: a failing node is drained ("clustertrain (health check): why") and resumed once the
  check passes, unless the drain is someone else's;
- the share's cordon record (roles/slurm/files/cordon.py): a cordon "health check: why"
  when the check starts failing, and an uncordon when it passes again. The cordon is
  written as root on the node, which the share squashes to its anonymous user (nobody):
  no user can write such a file. The uncordon lifts only what its author may: with root
  squashed, the health checks' own cordons; where root is not squashed root is an admin,
  whose uncordon lifts every cordon, so it is written only when every cordon held is a
  health check's;
- the history (SHARE/health/NODE.jsonl, one JSON line per change; the nfs_server role
  makes health/ the anonymous user's, so only root on a node writes there). A line that
  cannot be written (the share stalls) waits in STATE_DIR/outbox.jsonl for the next run.

- who fills the share: on the host that exports it (the nfs_server group's, `export` in
  the config), while the share is nearly full (below min_free_gb, or NEARLY_FULL of its
  space or inodes), root walks the export directory, which no squashing hides from it, at
  most every USERS_EVERY seconds unless its use moved, and writes each user's bytes to
  SHARE/health/users.json (USERS): preflight names the biggest users when it refuses or
  warns about the share. Names and totals only, as `sshare` shows every user's use; no
  path is written. Gone once the share has room again.

The standard library only (the role installs it beside cordon.py, root's). It is also
the node package's module orchestrator.node.health (orchestrator/node/__init__.py:
ROLE_MODULES), for `read_state` and `history`.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

# The cordon record's rule: the node package's module, or (run as a script) the cordon.py
# beside this file, the role's copy.
if not __package__:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
cordon = importlib.import_module(".cordon", __package__) if __package__ else \
    importlib.import_module("cordon")
untrusted = cordon.untrusted   # reading what users wrote (the slurm role's untrusted.py)

CONFIG = "/etc/clustertrain/health.json"          # written by roles/health
LIB_DIR = "/usr/local/lib/clustertrain"           # where roles/health installs this file
STATE_DIR = "/var/lib/clustertrain-health"        # the unit's StateDirectory
UNIT = "clustertrain-health"                      # its service and timer
HISTORY_SUBDIR = "health"                         # under the share's root (nfs_server)
REBOOT_PENDING = "reboot-pending.json"            # in STATE_DIR: a reboot asked, not done
WHY = "health check: "                            # how the check's cordons begin
# Its Slurm drains: "clustertrain (health check): why". The space makes it a name no login
# name can be (useradd refuses one), so no user's drain helper ever takes it for his own.
DRAIN_WHO = "health check"
DRAINED_HERE = f"{cordon.DRAIN_MARK}{DRAIN_WHO})"  # how such a drain's reason begins
SUPERVISOR_PID = "supervisor.pid"  # in a run's job directory (node/protocol.SUPERVISOR_PID)
LOCAL_PLACES = ("/", "/tmp", "/home")
TEMP_PLACES = ("/tmp", "/var/tmp", "/dev/shm")   # where any user writes on a node's own disk
TEMP_WALK = 60.0    # seconds the count of who fills them may take
USERS = "users.json"        # in HISTORY_SUBDIR: who fills a nearly full share
USERS_EVERY = 900.0         # seconds: a nearly full share is walked at most this often,
MOVED = 0.01                # unless its free space moved by more than this part of it
USERS_WAIT = 300.0          # seconds the walk may take (the unit's TimeoutStartSec has room)
BLOCK = 4096               # users.json is written in whole blocks of this size
NEARLY_FULL = 0.05          # below this part of its space or inodes, a filesystem is nearly
                            # full (preflight warns: orchestrator/defaults.SPACE_WARN)
CHILD_WAIT = 2.0     # seconds past share_timeout given to the child that writes the share
# Xids that mean the GPU (or its memory, or its link) is broken until a reset: NVIDIA's
# "XID Errors" list (48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen off
# the bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP).
BROKEN_XIDS = {48: "double-bit ECC error", 63: "row remapping event",
               64: "row remapping failure", 74: "NVLink error", 79: "fallen off the bus",
               92: "high single-bit ECC error rate", 94: "contained ECC error",
               95: "uncontained ECC error", 119: "GSP timeout", 120: "GSP error"}
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)")
SMI_FIELDS = ("index", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
              "remapped_rows.pending", "remapped_rows.failure")


class ConfigError(Exception):
    """The config file is missing or wrong: the message names the key and the fix."""


@dataclass(frozen=True)
class Config:
    """What roles/health writes to CONFIG (its defaults, meta/argument_specs.yml)."""

    node: str
    share: str
    share_timeout: float = 10.0
    min_free_gb: float = 2.0
    min_free_inodes: int = 1000
    max_clock_offset: float = 1.0
    slurm: bool = False
    admin_group: str | None = cordon.DEFAULT_ADMIN_GROUP
    nvidia_smi: str = "nvidia-smi"
    scontrol: str = "scontrol"
    squeue: str = "squeue"
    journalctl: str = "journalctl"
    reboot: tuple[str, ...] = ("systemctl", "reboot")
    edac: str = "/sys/devices/system/edac/mc"
    places: tuple[str, ...] = LOCAL_PLACES
    export: str | None = None        # the share's export directory, on its server only

    @classmethod
    def load(cls, path: str) -> Config:
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: {exc}: run site.yml (roles/health writes it)") \
                from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: not a JSON object: run site.yml (roles/health)")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{path}: unknown keys {unknown}; known: {sorted(known)}")
        for key in ("node", "share"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise ConfigError(f"{path}: {key!r} must be a non-empty string")
        if not cordon.NODE_NAME.match(data["node"]):
            raise ConfigError(f"{path}: node {data['node']!r} is not a node name")
        for key in ("share_timeout", "min_free_gb", "max_clock_offset", "min_free_inodes"):
            value = data.get(key, getattr(cls, key))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"{path}: {key} {value!r}: give a number of at least 0")
        if not isinstance(data.get("slurm", False), bool):
            raise ConfigError(f"{path}: slurm {data['slurm']!r}: give true or false")
        for key in ("nvidia_smi", "scontrol", "squeue", "journalctl", "edac"):
            if not isinstance(data.get(key, "x"), str) or not data.get(key, "x"):
                raise ConfigError(f"{path}: {key} {data[key]!r}: give a command or path")
        export = data.get("export")
        if export is not None and not (isinstance(export, str) and export.startswith("/")):
            raise ConfigError(f"{path}: export {export!r}: give the export's absolute path, "
                              "or null on a node that does not serve the share")
        if not isinstance(data.get("admin_group"), (str, type(None))):
            raise ConfigError(f"{path}: admin_group {data['admin_group']!r}: give a group name")
        places = data.get("places", list(LOCAL_PLACES))
        if not isinstance(places, list) or not all(
                isinstance(p, str) and p.startswith("/") for p in places):
            raise ConfigError(f"{path}: places {places!r}: give a list of absolute paths")
        if "places" in data:
            data["places"] = tuple(places)
        reboot = data.get("reboot", ["systemctl", "reboot"])
        if not isinstance(reboot, list) or not reboot or not all(
                isinstance(w, str) and w for w in reboot):
            raise ConfigError(f"{path}: reboot {reboot!r}: give a command as a list of words")
        if "reboot" in data:
            data["reboot"] = tuple(reboot)
        return cls(**data)


@dataclass(frozen=True)
class Failure:
    """One failed check: which (share, space, gpu, clock, memory), why, and whether it
    holds until the node reboots (a broken GPU's Xid: the kernel says it once). A WARNING
    is said, never cordoned for: a local disk that users' temporary files fill (blamed)."""

    check: str
    why: str
    sticky: bool = False
    warning: bool = False


# -- the checks -------------------------------------------------------------------------------

def measure(paths: list[str]) -> dict[str, Any]:
    """statvfs of each of PATHS, and whether each is a mount point: what the child that
    touches the share returns (`health.py --measure PATH...`)."""
    out: dict[str, Any] = {}
    for path in paths:
        try:
            st = os.statvfs(path)
            os.listdir(path)
            out[path] = {"free": st.f_bavail * st.f_frsize, "total": st.f_blocks * st.f_frsize,
                         "ifree": st.f_favail, "itotal": st.f_files,
                         "mounted": os.path.ismount(path), "dev": os.stat(path).st_dev}
        except OSError as exc:
            out[path] = {"error": exc.strerror or str(exc)}
    return out


def _child(args: list[str], stdin: str | None, wait: float) -> tuple[str | None, str]:
    """Run this file with ARGS in a child given WAIT seconds; (its stdout, "") or (None,
    why). A child stuck on a stalled share is killed and not waited for."""
    argv, env = [sys.executable, os.path.abspath(__file__), *args], None
    if __package__:   # the node package's module: the child runs it as one too (its cordon)
        top = sys.modules[__package__.split(".")[0]].__file__ or ""
        paths = [os.path.dirname(os.path.dirname(top)), os.environ.get("PYTHONPATH", "")]
        argv = [sys.executable, "-m", __spec__.name if __spec__ else __name__, *args]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(stdin, timeout=wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(1.0)
        except subprocess.TimeoutExpired:
            pass   # in the kernel's hands until the share answers: left to end then
        return None, f"did not answer within {wait:g} s"
    if proc.returncode != 0:
        return None, (err.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return out, ""


def check_share(cfg: Config) -> tuple[list[Failure], dict[str, Any] | None]:
    """The share answers within share_timeout, and is a mount: failures, and its figures."""
    out, why = _child(["--measure", cfg.share], None, cfg.share_timeout)
    if out is None:
        return [Failure("share", f"the share {cfg.share} {why} (an NFS server or mount that "
                        "stalls; see `mount` and the server's log)")], None
    got = json.loads(out)[cfg.share]
    if "error" in got:
        return [Failure("share", f"the share {cfg.share} cannot be read: {got['error']} "
                        "(run site.yml: the nfs_client role mounts it)")], None
    if not got["mounted"]:
        return [Failure("share", f"the share {cfg.share} is not mounted (run site.yml: the "
                        "nfs_client role mounts it)")], None
    return [], got


def check_space(figures: dict[str, dict[str, Any]], min_free_gb: float,
                min_free_inodes: int) -> list[Failure]:
    """A failure for each place (of FIGURES, {path: measure()'s entry}) below the limits."""
    failed = []
    for path, got in figures.items():
        if "error" in got or not got.get("total"):
            continue
        if got["free"] < min_free_gb * 2**30:
            failed.append(Failure("space", f"{path} has {got['free'] / 2**30:.2f} GiB free of "
                                  f"{got['total'] / 2**30:.1f}, below {min_free_gb:g} GiB "
                                  "(cluster_min_free_gb): free some (`clustertrain du` "
                                  "shows who fills the share)"))
        elif got["itotal"] and got["ifree"] < min_free_inodes:
            failed.append(Failure("space", f"{path} has {got['ifree']} inodes free of "
                                  f"{got['itotal']}, below {min_free_inodes}: remove files"))
    return failed


def temp_users(dev: int, deadline: float, places: tuple[str, ...] = TEMP_PLACES
               ) -> dict[str, int] | None:
    """Each user's bytes (but root's) in the temporary PLACES on device DEV, biggest first;
    None when they were not all counted by DEADLINE (time.monotonic()). Walked as the
    share's users are (walk(): no link followed, no directory swapped in mid-walk)."""
    totals: dict[int, int] = {}
    for top in places:
        try:
            here = os.lstat(top)
        except OSError:
            continue
        if here.st_dev != dev or not stat.S_ISDIR(here.st_mode):
            continue
        for info, _ in walk(top):
            if time.monotonic() > deadline:
                return None
            if info.st_dev == dev and info.st_uid != 0 and not stat.S_ISDIR(info.st_mode):
                totals[info.st_uid] = totals.get(info.st_uid, 0) + info.st_blocks * 512
    return {cordon.user_name(uid): used
            for uid, used in sorted(totals.items(), key=lambda t: -t[1])}


def blamed(failure: Failure, path: str, got: dict[str, Any], min_free_gb: float,
           deadline: float, places: tuple[str, ...] = TEMP_PLACES,
           counted: dict[int, dict[str, int] | None] | None = None) -> Failure:
    """FAILURE (PATH, a place on the node's own disk, has too little free space: GOT its
    measure()) as a warning when users' temporary files there hold more than it lacks:
    the node is not broken, a user filled it, and a cordon would keep everyone off it
    for one user's files. The warning names the biggest of them; the failure too when
    they hold less. COUNTED keeps each device's count for the run's other places (/, /tmp
    and /home are often one disk: walked once)."""
    short = min_free_gb * 2**30 - got.get("free", 0)
    if failure.check != "space" or short <= 0 or "dev" not in got:
        return failure
    counted = {} if counted is None else counted
    if got["dev"] not in counted:
        counted[got["dev"]] = temp_users(got["dev"], deadline, places)
    users = counted[got["dev"]]
    if not users:
        return failure
    biggest = ", ".join(f"{name} {used / 2**30:.2f} GiB" for name, used in
                        list(users.items())[:3])
    if sum(users.values()) < short:
        return Failure(failure.check, f"{failure.why}; its temporary files' biggest users: "
                       f"{biggest}", failure.sticky)
    return Failure(failure.check, f"{path} has {got['free'] / 2**30:.2f} GiB free, below "
                   f"{min_free_gb:g} GiB, filled by temporary files ({', '.join(places)}) "
                   f"of {biggest}: they free them (the node is not cordoned for it)",
                   warning=True)


def check_gpus(nvidia_smi: str) -> list[Failure]:
    """nvidia-smi's word on the GPUs ([] on a node without it)."""
    if shutil.which(nvidia_smi) is None:
        return []
    try:
        done = subprocess.run([nvidia_smi, f"--query-gpu={','.join(SMI_FIELDS)}",
                               "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return [Failure("gpu", "nvidia-smi did not answer within 30 s (a hung GPU or "
                        "driver: see `dmesg` for Xid messages)", sticky=True)]
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return [Failure("gpu", f"nvidia-smi failed: {said[-1] if said else done.returncode} "
                        "(a GPU lost, or the driver: see `dmesg`)")]
    return gpu_failures(done.stdout)


def gpu_failures(csv: str) -> list[Failure]:
    """The failures in nvidia-smi's CSV of SMI_FIELDS ("[N/A]" where a GPU lacks one)."""
    failed = []
    for line in csv.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(SMI_FIELDS):
            continue
        index, ecc, retired, remap_pending, remap_failed = cells
        found = []
        if ecc.isdigit() and int(ecc) > 0:
            found.append(f"{ecc} uncorrected ECC error(s) since the driver loaded")
        if retired.lower() == "yes":
            found.append("a retired page pending (a reset retires it)")
        if remap_pending.lower() == "yes":
            found.append("a row remap pending (a reset applies it)")
        if remap_failed.lower() == "yes":
            found.append("a row remap failed (the GPU needs replacing)")
        if found:
            failed.append(Failure("gpu", f"GPU {index}: {'; '.join(found)}"))
    return failed


def xid_failures(kernel_log: str) -> list[Failure]:
    """The Xid messages of KERNEL_LOG that mean a broken GPU, one failure per GPU (sticky:
    the kernel says it once)."""
    seen: dict[str, int] = {}
    for bus, xid in XID_LINE.findall(kernel_log):
        if int(xid) in BROKEN_XIDS:
            seen.setdefault(bus, int(xid))
    return [Failure("gpu", f"GPU {bus}: Xid {xid} ({BROKEN_XIDS[xid]}) in the kernel's log; "
                    "reset the GPU or reboot the node, then lift the cordon", sticky=True)
            for bus, xid in seen.items()]


def check_xids(journalctl: str, since: float | None) -> list[Failure]:
    """The kernel log's broken-GPU Xids since SINCE (the last check; this boot if None)."""
    if shutil.which(journalctl) is None:
        return []
    args = [journalctl, "-k", "-q", "-o", "cat", "--no-pager", "-g", "NVRM: Xid"]
    args += [f"--since=@{int(since)}"] if since else ["-b"]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return []
    return xid_failures(done.stdout)


CHRONY_OFFSET = re.compile(r"^System time\s*:\s*([\d.]+) seconds (fast|slow)", re.MULTILINE)


def clock_failures(tracking: str, max_offset: float) -> list[Failure]:
    """From `chronyc tracking`: a failure when the clock is off by more than MAX_OFFSET
    seconds while chrony is synchronised (unsynchronised: nothing to compare with)."""
    if "Not synchronised" in tracking:
        return []
    found = CHRONY_OFFSET.search(tracking)
    if not found or float(found.group(1)) <= max_offset:
        return []
    return [Failure("clock", f"the clock is {found.group(1)} s {found.group(2)} of its time "
                    f"sources, over {max_offset:g} s (chronyc tracking; see chronyc sources)")]


def check_clock(max_offset: float) -> list[Failure]:
    if shutil.which("chronyc") is None:
        return []
    try:
        done = subprocess.run(["chronyc", "-n", "tracking"], capture_output=True, text=True,
                              timeout=10, check=False)
    except subprocess.TimeoutExpired:
        return []
    return clock_failures(done.stdout, max_offset) if done.returncode == 0 else []


def check_memory(edac: str) -> list[Failure]:
    """Uncorrected memory errors the kernel's EDAC counted, per memory controller."""
    failed = []
    try:
        controllers = sorted(n for n in os.listdir(edac) if n.startswith("mc"))
    except OSError:
        return []
    for mc in controllers:
        try:
            with open(os.path.join(edac, mc, "ue_count"), encoding="ascii") as fh:
                count = int(fh.read().strip() or 0)
        except (OSError, ValueError):
            continue
        if count:
            failed.append(Failure("memory", f"{count} uncorrected memory error(s) on {mc} "
                                  "(EDAC): replace the memory", sticky=True))
    return failed


def run_checks(cfg: Config, since: float | None) -> list[Failure]:
    failures, share = check_share(cfg)
    places = [p for p in cfg.places if os.path.isdir(p)]
    out, why = _child(["--measure", *places], None, cfg.share_timeout) if places else ("{}", "")
    figures = json.loads(out) if out is not None else {}
    if out is None:   # a home on NFS, say
        failures.append(Failure("space", f"{', '.join(places)}: measuring them {why}"))
    deadline = time.monotonic() + TEMP_WALK
    counted: dict[int, dict[str, int] | None] = {}   # each disk's count, walked once
    for path, got in figures.items():
        failures += [blamed(f, path, got, cfg.min_free_gb, deadline, counted=counted)
                     for f in check_space({path: got}, cfg.min_free_gb, cfg.min_free_inodes)]
    if share:
        failures += check_space({cfg.share: share}, cfg.min_free_gb, cfg.min_free_inodes)
    failures += check_gpus(cfg.nvidia_smi) + check_xids(cfg.journalctl, since)
    failures += check_clock(cfg.max_clock_offset) + check_memory(cfg.edac)
    return failures


# -- the state, on the node's own disk ------------------------------------------------------

@dataclass
class State:
    """The node's last verdict: STATE_DIR/state.json."""

    node: str
    checked: float = 0.0
    boot: str = ""
    failing: list[dict[str, Any]] = field(default_factory=list)   # Failure as dicts
    since: float | None = None       # when it started failing
    cordoned: bool = False           # its cordon is in the share's record
    drained: bool = False            # Slurm drained it for this check
    warnings: list[dict[str, Any]] = field(default_factory=list)  # said, not cordoned for

    def why(self) -> str:
        return "; ".join(f["why"] for f in self.failing)


def read_state(state_dir: str = STATE_DIR) -> dict[str, Any] | None:
    """The node's last verdict as JSON (None when the check never ran here)."""
    try:
        with open(os.path.join(state_dir, "state.json"), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: str, value: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(value, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)   # every user's preflight reads it
    os.replace(tmp, path)


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


# -- the share: history and cordons, written by a child that may stall ----------------------

def history_path(share: str, node: str) -> str:
    return os.path.join(share, HISTORY_SUBDIR, f"{node}.jsonl")


def publish(request: dict[str, Any]) -> dict[str, Any]:
    """The child's work (`health.py --publish`, request on stdin): append the history
    lines, then add the cordon or the uncordon. {"written": n, "cordoned": bool,
    "uncordoned": bool, "error": why or None}."""
    share, node = request["share"], request["node"]
    out: dict[str, Any] = {"written": 0, "cordoned": False, "uncordoned": False, "error": None}
    lines = request.get("history") or []
    if lines:
        with open(history_path(share, node), "a", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write("".join(json.dumps(line) + "\n" for line in lines))
            fh.flush()
            os.fsync(fh.fileno())
        out["written"] = len(lines)
    try:
        if request.get("cordon"):
            cordon.record(share, node, cordon.CORDON, WHY + request["cordon"])
            out["cordoned"] = True
        elif request.get("uncordon"):
            out["uncordoned"] = _lift_own(share, node, request.get("admin_group"))
    except (cordon.NoRecord, OSError) as exc:
        out["error"] = str(exc)
    return out


def _lift_own(share: str, node: str, admin_group: str | None) -> bool:
    """Write this check's uncordon of NODE when it lifts only health checks' cordons."""
    admins = cordon.Admins(admin_group)
    me = os.geteuid()
    held = cordon.decide(cordon.read(share, node)[0], admins).get(node, cordon.NodeState()).held
    lifts = [c for c in held if cordon.may_lift(me, c, admins)]
    if not lifts or any(not c.why.startswith(WHY) for c in lifts):
        return False
    cordon.record(share, node, cordon.UNCORDON, WHY + "passes again")
    return True


# -- maintenance: a reboot that waits until nothing runs on the node ------------------------

def ask_reboot(state_dir: str, why: str, now: float) -> None:
    """Ask this node to reboot once nothing runs on it, for WHY (kept until it rebooted)."""
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    _write_json(os.path.join(state_dir, REBOOT_PENDING),
                {"why": why, "boot": boot_id(), "asked": now})


def pending_reboot(state_dir: str, boot: str) -> dict[str, Any] | None:
    """The reboot asked of this node and not done yet; None when none was asked, or when
    the node has rebooted since (which ends the request)."""
    path = os.path.join(state_dir, REBOOT_PENDING)
    try:
        with open(path, encoding="utf-8") as fh:
            asked = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:   # held all the same: a reboot is not lost
        return {"why": f"a reboot was asked ({path} unreadable: {exc})", "boot": boot}
    if not isinstance(asked, dict) or asked.get("boot") != boot:
        os.unlink(path)
        return None
    return asked


def supervised_run(argv: list[str]) -> str | None:
    """The run id of a supervisor's command line, else None: `PYTHON .../node.py supervise
    ... --run RUN ... -- TORCHRUN...` as the launch starts it (run/command.py,
    NodeCommand.shell), or `python -m orchestrator.node supervise ...`."""
    if "supervise" not in argv or os.path.basename(argv[0]) == "srun":
        return None   # srun starting a supervisor as a Slurm step: that supervisor counts
    i = argv.index("supervise")
    head = argv[:i]
    if not head or not (os.path.basename(head[-1]) == "node.py"
                        or head[-2:] == ["-m", "orchestrator.node"]):
        return None
    return _option(argv[i + 1:], "--run")


def _option(words: list[str], name: str) -> str | None:
    """The value of option NAME among a supervisor's WORDS before its `--` (the rest is
    torchrun's), else None."""
    ours = words[:words.index("--")] if "--" in words else words
    for j, word in enumerate(ours):
        if word == name and j + 1 < len(ours):
            return ours[j + 1]
        if word.startswith(f"{name}="):
            return word[len(name) + 1:]
    return None


def proven_run(pid: int, argv: list[str], uid: int) -> str | None:
    """The run of process PID (ARGV its command line, UID its owner) if it is a run's
    supervisor and its job directory says so: JOB/supervisor.pid, written by the launch
    once the supervisor started, a regular file of UID's (not a link) that holds PID.
    Else None: a process merely named like a supervisor (`exec -a`, a script called
    node.py) holds nothing up. Root reads it; what a user wrote is read as untrusted."""
    run = supervised_run(argv)
    job = _option(argv, "--job") if run else None
    if not job or not os.path.isabs(job):
        return None
    try:
        said = untrusted.read_bytes(os.path.join(job, SUPERVISOR_PID), 64, uid)
    except untrusted.NotRead:
        return None
    return run if said.strip() == str(pid).encode() else None


GPU_DEVICE = re.compile(r"/dev/nvidia\d+")


def _process_says(pid: str) -> tuple[list[str], list[str]]:
    """PID's command line and the GPU devices it holds open ([] each when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [w.decode(errors="replace") for w in fh.read().split(b"\0")[:-1]]
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return [], []
    held = []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if GPU_DEVICE.fullmatch(target):
            held.append(target)
    return argv, sorted(set(held))


def still_running(cfg: Config) -> list[str]:
    """What a reboot of this node would end, each said in a few words (empty: nothing):
    Slurm's jobs on it, the supervisors of runs started over SSH (proven_run: a process
    only named like one is not), processes that hold a GPU. What cannot be read counts as
    running: nothing is rebooted on a guess."""
    found = []
    if cfg.slurm:
        try:
            done = subprocess.run([cfg.squeue, "-h", "-w", cfg.node, "-o", "%i %u"],
                                  capture_output=True, text=True, timeout=30, check=False)
            said = done.stdout if done.returncode == 0 else None
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        except (OSError, subprocess.TimeoutExpired) as exc:
            said, why = None, str(exc)
        if said is None:
            found.append(f"Slurm's jobs on it (squeue: {why})")
        for line in (said or "").splitlines():
            if len(line.split()) == 2:
                found.append("Slurm job {} of {}".format(*line.split()))
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
        if int(pid) == os.getpid():
            continue
        argv, gpus = _process_says(pid)
        if not argv and not gpus:
            continue
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue   # ended meanwhile
        run = proven_run(int(pid), argv, uid)
        if run or gpus:
            owner = cordon.user_name(uid)
            found.append(f"run {run} of {owner}" if run else
                         f"process {pid} of {owner} on {', '.join(gpus)}")
    return list(dict.fromkeys(found))


# -- one run of the check -----------------------------------------------------------------

def _drain(cfg: Config, why: str) -> bool:
    slurm = cordon.Slurm(cfg.share, cfg.admin_group, cfg.scontrol)
    try:
        now = cordon.drained(slurm, cfg.node)
        if now is not None and not now.startswith(DRAINED_HERE):
            return False   # drained already, for someone else's reason: left alone
        cordon.scontrol(slurm, "update", f"NodeName={cfg.node}", "State=DRAIN",
                        cordon.drain_reason(DRAIN_WHO, why))
        return True
    except (cordon.Refused, OSError, subprocess.TimeoutExpired) as exc:
        print(f"could not drain {cfg.node} in Slurm: {exc}", file=sys.stderr)
        return False


def _resume(cfg: Config) -> None:
    slurm = cordon.Slurm(cfg.share, cfg.admin_group, cfg.scontrol)
    try:
        now = cordon.drained(slurm, cfg.node)
        if now is not None and now.startswith(DRAINED_HERE):
            cordon.scontrol(slurm, "update", f"NodeName={cfg.node}", "State=RESUME")
    except (cordon.Refused, OSError, subprocess.TimeoutExpired) as exc:
        print(f"could not return {cfg.node} to Slurm: {exc}", file=sys.stderr)


def step(cfg: Config, state_dir: str = STATE_DIR, now: float | None = None,
         failures: list[Failure] | None = None, may_reboot: bool = True) -> State:
    """One run: check (FAILURES given: tests), act on the change, keep the state; reboot
    the node when a reboot was asked of it and nothing runs on it (unless not MAY_REBOOT)."""
    stamp = time.time() if now is None else now
    old = read_state(state_dir) or {}
    state = State(**{k: v for k, v in old.items() if k in State.__dataclass_fields__}) \
        if old.get("node") == cfg.node else State(cfg.node)
    boot = boot_id()
    found = run_checks(cfg, state.checked or None) if failures is None else list(failures)
    state.warnings = [asdict(f) for f in found if f.warning]
    found = [f for f in found if not f.warning]
    asked = pending_reboot(state_dir, boot)
    if asked:
        found.append(Failure("maintenance", f"{asked['why']}: it reboots once nothing runs "
                             "on it"))
    kept = [Failure(**f) for f in state.failing if f.get("sticky")] \
        if state.boot == boot else []   # a reboot resets the GPU and the counters
    if kept and state.cordoned and not _still_cordoned(cfg):
        kept = []   # an admin lifted the cordon: the broken GPU was seen to
    failing = list({(f.check, f.why): f for f in kept + found}.values())
    was = bool(state.failing)
    history: list[dict[str, Any]] = []
    request: dict[str, Any] = {"share": cfg.share, "node": cfg.node,
                               "admin_group": cfg.admin_group}
    if failing and not was:
        state.since = stamp
        history.append({"time": stamp, "node": cfg.node, "event": "failing",
                        "failures": [asdict(f) for f in failing]})
    elif failing and {(f.check, f.why) for f in failing} != \
            {(f["check"], f["why"]) for f in state.failing}:
        history.append({"time": stamp, "node": cfg.node, "event": "still failing",
                        "failures": [asdict(f) for f in failing]})
    elif was and not failing:
        history.append({"time": stamp, "node": cfg.node, "event": "passing",
                        "failures": []})
    state.failing = [asdict(f) for f in failing]
    state.checked, state.boot = stamp, boot
    if failing:
        if cfg.slurm and not state.drained:
            state.drained = _drain(cfg, state.why())
        if not state.cordoned:
            request["cordon"] = state.why()
    else:
        if state.drained:
            _resume(cfg)
        state.drained = False
        state.since = None
        if state.cordoned:
            request["uncordon"] = True
    reboot = bool(asked) and may_reboot and _may_reboot_now(cfg, state)
    if reboot:
        history.append({"time": stamp, "node": cfg.node, "event": "rebooting",
                        "failures": [asdict(f) for f in failing if f.check == "maintenance"]})
    outbox = os.path.join(state_dir, "outbox.jsonl")
    pending = _read_lines(outbox) + history
    request["history"] = pending
    published = None
    if pending or request.get("cordon") or request.get("uncordon"):
        out, why = _child(["--publish"], json.dumps(request), cfg.share_timeout + CHILD_WAIT)
        published = json.loads(out) if out is not None else {"error": why}
    if published is not None:
        if published.get("cordoned"):
            state.cordoned = True
        if request.get("uncordon") and (published.get("uncordoned") or not published.get("error")):
            state.cordoned = False
        pending = pending[int(published.get("written") or 0):]
    _write_lines(outbox, pending)
    _write_json(os.path.join(state_dir, "state.json"), asdict(state))
    if failures is None:
        share_users(cfg, stamp)
    if reboot and asked:
        print(f"{cfg.node}: nothing runs on it: rebooting ({asked['why']})", flush=True)
        subprocess.run(list(cfg.reboot), check=False, timeout=60)
    return state


def _may_reboot_now(cfg: Config, state: State) -> bool:
    """Whether nothing runs on the node and nothing new can start on it: Slurm drained it
    (for this check or anyone), and no run of ours or process on a GPU is left."""
    if cfg.slurm:
        try:
            if cordon.drained(cordon.Slurm(cfg.share, cfg.admin_group, cfg.scontrol),
                              cfg.node) is None:
                return False
        except (cordon.Refused, OSError, subprocess.TimeoutExpired):
            return False
    running = still_running(cfg)
    if running:
        print(f"{cfg.node}: its reboot waits for {'; '.join(running)}", flush=True)
    return not running


def _still_cordoned(cfg: Config) -> bool:
    """Whether this check's cordon of the node still holds in the share's record (True when
    the record cannot be read in time: nothing is dropped on a guess)."""
    out, _ = _child(["--held", cfg.node, cfg.share, cfg.admin_group or ""], None,
                    cfg.share_timeout)
    return True if out is None else bool(json.loads(out))


def _read_lines(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except (OSError, ValueError):
        return []


def _write_lines(path: str, lines: list[dict[str, Any]]) -> None:
    if not lines:
        if os.path.exists(path):
            os.unlink(path)
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(line) + "\n" for line in lines))
    os.replace(tmp, path)


# -- who fills the share: on its server, while it is nearly full -----------------------------

def walk(root: str, unread: Callable[[str, str], None] | None = None
         ) -> Iterator[tuple[os.stat_result, tuple[str, ...]]]:
    """Every entry under ROOT (lstat'ed; a file with hard links once), with the parts of its
    path below ROOT. A directory is entered only as what was seen of it: opened without
    following a link, and only while it is the directory lstat saw (a user who swaps his
    directory for a link once it was seen does not lead the walk elsewhere); each once. One
    that cannot be listed is passed to UNREAD (its path, why) and skipped. node/du.py
    counts by it too."""
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[str, tuple[str, ...], os.stat_result | None]] = [(root, (), None)]
    while stack:
        path, parts, was = stack.pop()
        try:
            found = _listed(path, was)
        except untrusted.NotRead as exc:
            if unread:
                unread(path, os.strerror(exc.errno) if exc.errno else exc.why)
            continue
        except OSError as exc:
            if unread:
                unread(path, exc.strerror or str(exc))
            continue
        for entry in found:
            st = entry.info
            if st.st_nlink > 1 or stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            here = (*parts, entry.name)
            yield st, here
            if stat.S_ISDIR(st.st_mode):
                stack.append((os.path.join(path, entry.name), here, st))


def _listed(path: str, was: os.stat_result | None) -> list[Any]:
    """The entries of the directory PATH (untrusted.Entry, lstat'ed), opened without
    following a link and, given WAS (its lstat when it was listed), only as that one."""
    fd = untrusted.open_dir(path, seen=was) if was is not None else \
        os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        found: list[Any] = untrusted.entries(fd)
    finally:
        os.close(fd)
    return found


def nearly_full(got: dict[str, Any], min_free_gb: float) -> bool:
    """Whether a filesystem with statvfs figures GOT (measure()'s) is nearly full: below
    MIN_FREE_GB, or NEARLY_FULL of its space or inodes."""
    return bool(got.get("total")) and (
        got["free"] < min_free_gb * 2**30 or got["free"] < NEARLY_FULL * got["total"]
        or bool(got["itotal"]) and got["ifree"] < NEARLY_FULL * got["itotal"])


def users_path(share: str) -> str:
    return os.path.join(share, HISTORY_SUBDIR, USERS)


def count_users(export: str, got: dict[str, Any], min_free_gb: float, now: float
                ) -> bool:
    """On the share's server, with the export's figures GOT (measure()'s): when it is nearly
    full, and its users.json older than USERS_EVERY or its free space moved by MOVED since,
    every user's bytes written there (True: walked); when it has room, users.json removed."""
    path = users_path(export)
    if not nearly_full(got, min_free_gb):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return False
    old = read_users(export)
    if old and now - float(old.get("time") or 0) < USERS_EVERY and \
            abs(float(old.get("free") or 0) - got["free"]) <= MOVED * got["total"]:
        return False
    users: dict[str, int] = {}
    unread: list[str] = []
    for st, _ in walk(export, lambda p, _why: unread.append(p)):
        name = cordon.user_name(st.st_uid)
        users[name] = users.get(name, 0) + st.st_blocks * 512
    _write_counted(path, {"time": now, "free": got["free"], "total": got["total"],
                          "users": dict(sorted(users.items(), key=lambda u: -u[1])),
                          "unread": len(unread)})
    return True


def _write_counted(path: str, value: dict[str, Any]) -> None:
    """users.json, padded with spaces to whole blocks (BLOCK): on a share too full for a
    new file the new count overwrites the old in place, in the blocks it holds."""
    text = json.dumps(value).encode()
    text += b" " * (-len(text) % BLOCK)
    try:
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        try:
            os.unlink(f"{path}.tmp")
        except FileNotFoundError:
            pass
        with open(path, "r+b") as fh:   # FileNotFoundError: none yet, nothing to reuse
            old = fh.seek(0, os.SEEK_END)
            if len(text) > old:
                raise
            fh.seek(0)
            fh.write(text + b" " * (old - len(text)))
            fh.flush()
            os.fsync(fh.fileno())


def read_users(share: str) -> dict[str, Any] | None:
    """users.json of SHARE (what preflight names when the share is nearly full): {"time",
    "free", "total", "users": {name: bytes, biggest first}, "unread": n}; None when the
    share has room (or its server does not run this check)."""
    try:
        with open(users_path(share), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("users"), dict) else None


def share_users(cfg: Config, now: float) -> None:
    """On the share's server: count_users in a child (`health.py --users EXPORT MIN_FREE_GB
    NOW`) given USERS_WAIT seconds."""
    if not cfg.export or not os.path.isdir(cfg.export):
        return
    out, why = _child(["--users", cfg.export, repr(cfg.min_free_gb), repr(now)], None,
                      USERS_WAIT)
    if out is None:
        print(f"{cfg.node}: who fills the share was not counted: {why}", file=sys.stderr)


# -- what `clustertrain nodes` reads --------------------------------------------------------

def history(share: str, since: float) -> dict[str, list[dict[str, Any]]]:
    """Every node's history lines on SHARE from SINCE on: {node: [lines, oldest first]}."""
    where = os.path.join(share, HISTORY_SUBDIR)
    out: dict[str, list[dict[str, Any]]] = {}
    try:
        names = sorted(os.listdir(where))
    except OSError:
        return out
    for name in names:
        node = name[:-len(".jsonl")]
        if not name.endswith(".jsonl") or not cordon.NODE_NAME.match(node):
            continue
        lines = [line for line in _read_lines(os.path.join(where, name))
                 if isinstance(line, dict) and float(line.get("time") or 0) >= since]
        if lines:
            out[node] = lines
    return out


def nodes_view(share: str, since: float, admin_group: str | None) -> dict[str, Any]:
    """What `clustertrain nodes` reads of the share: every node's health history, its
    cordon now, and the runs that lost it (the cordons runs wrote), from SINCE on."""
    events, _ = cordon.read(share)
    states = cordon.decide(events, cordon.Admins(admin_group or cordon.DEFAULT_ADMIN_GROUP))
    runs: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if e.action == cordon.CORDON and e.run and e.time >= since:
            runs.setdefault(e.node, []).append({"run": e.run, "time": e.time, "by": e.by,
                                                "why": e.why})
    return {"history": history(share, since), "runs_failed": runs,
            "cordoned": {n: cordon.cordon_of(s) for n, s in sorted(states.items()) if s.held}}


def main(argv: list[str] | None = None) -> int:
    import argparse  # here: the probe imports this module for read_state alone

    p = argparse.ArgumentParser(prog="clustertrain-health", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--state-dir", default=STATE_DIR)
    p.add_argument("--measure", nargs="+", metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--publish", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--users", nargs=3, metavar=("EXPORT", "MIN_FREE_GB", "NOW"),
                   help=argparse.SUPPRESS)
    p.add_argument("--held", nargs=3, metavar=("NODE", "SHARE", "ADMIN_GROUP"),
                   help=argparse.SUPPRESS)
    p.add_argument("--defer-reboot", metavar="WHY",
                   help="ask for a reboot once nothing runs on the node: it is cordoned now, "
                   "and a check reboots it when its work has ended (roles/nvidia_driver); "
                   "prints JSON: what still runs, whether it is cordoned and drained")
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return 0
    if args.publish:
        print(json.dumps(publish(json.load(sys.stdin))))
        return 0
    if args.users:
        export, min_free_gb, now = args.users
        got = measure([export])[export]
        if "error" in got:
            print(f"{export}: {got['error']}", file=sys.stderr)
            return 1
        print(json.dumps(count_users(export, got, float(min_free_gb), float(now))))
        return 0
    if args.held:
        node, share, group = args.held   # an admin's uncordon lifts the check's cordon
        held = cordon.decide(cordon.read(share, node)[0], cordon.Admins(group or None)).get(node)
        print(json.dumps(any(c.why.startswith(WHY) and c.uid == os.geteuid()
                             for c in (held.held if held else []))))
        return 0
    try:
        cfg = Config.load(args.config)
    except ConfigError as exc:
        print(f"clustertrain-health: {exc}", file=sys.stderr)
        return 2
    if args.defer_reboot:
        ask_reboot(args.state_dir, args.defer_reboot, time.time())
        state = step(cfg, args.state_dir, may_reboot=False)
        print(json.dumps({"running": still_running(cfg), "cordoned": state.cordoned,
                          "drained": state.drained}))
        return 0
    state = step(cfg, args.state_dir)
    print(f"{cfg.node}: " + (f"failing: {state.why()}" if state.failing else "healthy")
          + (" (cordoned)" if state.cordoned else "") + (" (drained)" if state.drained else "")
          + "".join(f"; warning: {w['why']}" for w in state.warnings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
