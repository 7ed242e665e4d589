"""Who used the cluster, and how much (`node.py usage`, the node side of `clustertrain
usage`): node-hours and GPU-hours per user and per run, from the runs' records on the
share (checkpoints/USER/.clustertrain/runs/RUN/NODE.json, each node's part as its
supervisor wrote it: its user, when it started and ended, the GPUs it used, and the
GPU-seconds those GPUs did nothing: sysmetrics.IdleGpus).

A record counts for its file's owner, who must be the user whose directory it lies in
(checkpoints/USER): one in another user's name (or in a directory of no user) is refused,
and said with its owner. Every file there is read as untrusted (untrusted.py): no link
followed, no pipe waited on, a bounded size, a bounded number per owner and directory.

A part still running counts until its state's last writing (its supervisor rewrites it
every few seconds); one whose last writing is older than STATE_STALE ended then (its node
was lost, and never wrote its end). Only the time inside the window counts (SINCE to
now). As for `du`, a user reads the records the share's modes let them (their own); an admin reads
everyone's as root (`usage --all`, through sudo).

A run whose every part ended more than fold.FOLD_AFTER ago is folded by a later run's
start into its user's ledger (ledger.py: checkpoints/USER/.clustertrain/usage-ledger.json,
daily totals, counted with `part` as here) and its directory removed. The ledger's days
whose middle lies in the window count too, whole: folded runs are counted by the UTC day,
and have no line of their own. The ledger is read as the records are: its owner must be
the user whose directory it lies in, or it is refused and said.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import pwd
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from . import ledger, untrusted
from .protocol import NODE_STATE_DIR, STATE_STALE
from .sysmetrics import visible_gpus
from .untrusted import visible
from .util import owner_of, user_name

HOUR = 3600.0
IDLE_HOURS = 1.0   # a run (or notebook) whose GPUs sat idle this many GPU-hours is listed
MAX_RECORD = 1 << 20   # bytes: a node's state is a few KiB; a bigger file is no state
MAX_RUNS = 20000       # runs read in one user's records, per owner (the newest)
MAX_FILES = 1024       # files read in one run's directory, per owner (the newest)
READS = 3              # a user's records read again at most this often (a fold went by)


def gpus_used(argv: list[str], environ: dict[str, str] | os._Environ[str] = os.environ,
              devices: int | None = None) -> int:
    """The GPUs a node's part of a run uses: those CUDA_VISIBLE_DEVICES shows it (Slurm's
    choice, read as the sampler reads it: sysmetrics.visible_gpus; named by UUID, each
    name), else as many of the node's GPUs (DEVICES, /dev/nvidiaN by default) as torchrun
    starts processes (--nproc-per-node N; `gpu` or `auto`: all of them)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        given = visible_gpus(environ)
        return len(given) if given is not None else len([d for d in visible.split(",")
                                                         if d.strip()])
    if devices is None:
        devices = len(glob.glob("/dev/nvidia[0-9]*"))
    if not devices:
        return 0
    nproc = next((argv[i + 1] for i, a in enumerate(argv[:-1])
                  if a in ("--nproc-per-node", "--nproc_per_node")), None)
    nproc = nproc or next((a.split("=", 1)[1] for a in argv
                           if a.startswith(("--nproc-per-node=", "--nproc_per_node="))), None)
    return min(devices, int(nproc)) if nproc and nproc.isdigit() else devices


def part(state: dict[str, Any], since: float, now: float
         ) -> tuple[float, float, float] | None:
    """Seconds of one node's part inside [SINCE, NOW], its GPU-seconds, and those of its
    GPU-seconds that were idle (the supervisor's count over the whole part, its share
    inside the window); None for a state that says no start."""
    started = state.get("started")
    if not isinstance(started, (int, float)):
        return None
    end = next((t for t in (state.get("ended"), state.get("time"))
                if isinstance(t, (int, float))), started)
    seconds = max(0.0, min(float(end), now) - max(float(started), since))
    gpus = state.get("gpus")
    gpu_seconds = seconds * (gpus if isinstance(gpus, int) and gpus > 0 else 0)
    idle = state.get("gpu_idle_s")
    whole = float(end) - float(started)
    idle_seconds = min(gpu_seconds, float(idle) * seconds / whole) \
        if isinstance(idle, (int, float)) and idle > 0 and whole > 0 else 0.0
    return seconds, gpu_seconds, idle_seconds


def end_of(state: dict[str, Any], now: float) -> float | None:
    """When a node's part ended: its end, or the last writing of a part whose supervisor
    went silent (its node lost: `runs` settles it so, STATE_STALE); None while it runs."""
    for key in ("ended", "time"):
        at = state.get(key)
        if isinstance(at, (int, float)) and (key == "ended" or now - at > STATE_STALE):
            return float(at)
    return None


@dataclass
class Found:
    """What a reading of the records found: the runs counted, the places it could not
    read, and the records it refused (each {"path", "owner", "why"})."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    unread: list[dict[str, str]] = field(default_factory=list)
    refused: list[dict[str, str]] = field(default_factory=list)
    ledgers: dict[str, tuple[ledger.Day, list[str]]] = field(default_factory=dict)

    def add(self, other: Found) -> None:
        self.runs += other.runs
        self.unread += other.unread
        self.refused += other.refused
        self.ledgers.update(other.ledgers)

    def refuse(self, path: str, uid: int | None, why: str) -> None:
        self.refused.append({"path": visible(path, ascii_only=True),
                             "owner": "?" if uid is None else user_name(uid), "why": why})


def usage(share: str, since: float = 0.0, now: float | None = None) -> dict[str, Any]:
    """{"since", "runs": [{"run", "user", "nodes", "start", "end", "node_hours",
    "gpu_hours", "idle_gpu_hours"}], "users": {user: {"runs", "node_hours", "gpu_hours",
    "idle_gpu_hours"}}, "idle": [the runs with IDLE_HOURS idle GPU-hours or more],
    "ledger": {user: {"runs", "node_hours", "gpu_hours", "idle_gpu_hours", "first_day",
    "last_day"}: the part of the user's figures that their ledger's days gave}, "unread":
    [{"path", "owner", "why"}], "refused": [the same: records not counted]}: the records
    (and ledgers) of every user this process may read. Each record counts for its file's
    owner, who must be the user whose directory it lies in; names from the share are
    shown with what is not ASCII made visible (a Cyrillic "а" is not an "a")."""
    now = time.time() if now is None else now
    found = Found()
    top = os.path.join(share, "checkpoints")
    try:
        users = untrusted.entries(top)
    except OSError as exc:
        return {"since": since, "runs": [], "users": {}, "idle": [], "refused": [],
                "ledger": {},
                "unread": [{"path": top, "owner": "?", "why": exc.strerror or str(exc)}]}
    for entry in sorted(users, key=lambda e: e.name):
        if stat.S_ISDIR(entry.info.st_mode):
            _user(top, entry.name, since, now, found)
    totals: dict[str, dict[str, Any]] = {}
    hours = ("node_hours", "gpu_hours", "idle_gpu_hours")
    for r in found.runs:
        t = totals.setdefault(r["user"], {"runs": 0, **dict.fromkeys(hours, 0.0)})
        t["runs"] += 1
        for key in hours:
            t[key] += r[key]
    folded = {user: _day_hours(day, days) for user, (day, days) in found.ledgers.items()
              if days}
    for user, f in folded.items():
        t = totals.setdefault(user, {"runs": 0, **dict.fromkeys(hours, 0.0)})
        t["runs"] += f["runs"]
        for key in hours:
            t[key] += f[key]
    return {"since": since, "runs": found.runs,
            "users": {u: {**t, **{k: round(t[k], 3) for k in hours}}
                      for u, t in sorted(totals.items())},
            "idle": [r for r in found.runs if r["idle_gpu_hours"] >= IDLE_HOURS],
            "ledger": {u: {**f, **{k: round(f[k], 3) for k in hours}}
                       for u, f in sorted(folded.items())},
            "unread": found.unread, "refused": found.refused}


def _day_hours(day: ledger.Day, days: list[str]) -> dict[str, Any]:
    """A ledger's days inside the window (DAY: their sum; DAYS: their names) in hours."""
    return {"runs": day.runs, "node_hours": day.node_s / HOUR, "gpu_hours": day.gpu_s / HOUR,
            "idle_gpu_hours": day.idle_gpu_s / HOUR, "first_day": days[0],
            "last_day": days[-1]}


def _user(top: str, user: str, since: float, now: float, found: Found) -> None:
    """USER's ledger and the runs in USER's records (TOP/USER/.clustertrain/runs), into
    FOUND: the newest MAX_RUNS of each owner there, nothing followed through a link, the
    runs the ledger counts already (its pending ones) left out. Read again (READS times at
    most) when a fold rewrote the ledger meanwhile: it may have folded runs read here."""
    try:
        uid: int | None = pwd.getpwnam(user).pw_uid
    except KeyError:
        uid = None   # no such user: every record there is refused, as another's
    try:
        fd = untrusted.open_below(top, (user, NODE_STATE_DIR))
    except untrusted.NotRead as exc:
        _not_opened(top, user, exc, found)
        return
    where = os.path.join(top, user, NODE_STATE_DIR)
    owner = Owner(user, uid)
    try:
        for _ in range(READS):
            mine = Found()
            book = _ledger(fd, where, owner, mine)
            if book is not None:
                mine.ledgers[user] = book.window(since, now)
            _runs(fd, where, owner, since, now, mine,
                  set(book.pending) if book is not None else set())
            if _generation(fd, uid) == (book.generation if book is not None else None):
                break
        found.add(mine)
    finally:
        os.close(fd)


def _not_opened(top: str, user: str, exc: untrusted.NotRead, found: Found) -> None:
    """USER's records could not be opened (EXC): none (said nowhere), not this process's
    to read (unread), or not followed (refused)."""
    if exc.errno == errno.ENOENT:
        return
    if exc.errno in (errno.EACCES, errno.EPERM):
        mine = os.path.join(top, user)
        found.unread.append({"path": visible(mine, ascii_only=True),
                             "owner": owner_of(mine), "why": os.strerror(exc.errno)})
    else:
        found.refused.append({"path": visible(exc.path, ascii_only=True),
                              "owner": owner_of(exc.path), "why": exc.why})


def _ledger(fd: int, where: str, owner: Owner, found: Found) -> ledger.Ledger | None:
    """OWNER's ledger in WHERE (opened as FD); None where there is none, or it is refused
    (said in FOUND: another's, a link, not a ledger)."""
    path = os.path.join(where, ledger.LEDGER)
    try:
        return ledger.read(fd, owner.uid)[0]
    except untrusted.NotRead as exc:
        if exc.uid is not None and exc.uid != owner.uid:
            found.refuse(path, exc.uid, f"its owner is {user_name(exc.uid)}, not "
                         f"{visible(owner.name, ascii_only=True)}, whose directory it lies "
                         "in: not counted")
        else:
            found.refuse(path, exc.uid, exc.why)
    except ValueError as exc:
        found.refuse(path, owner.uid, f"not a usage ledger ({exc}): not counted")
    return None


def _generation(fd: int, uid: int | None) -> int | None:
    """The generation of the ledger in FD now (None: none, or not one to read)."""
    try:
        book = ledger.read(fd, uid)[0]
    except (untrusted.NotRead, ValueError):
        return None
    return None if book is None else book.generation


def _runs(state_fd: int, where: str, owner: Owner, since: float, now: float, found: Found,
          pending: set[str]) -> None:
    """The runs in WHERE/runs (WHERE opened as STATE_FD) into FOUND, but those PENDING."""
    runs_path = os.path.join(where, "runs")
    try:
        fd = untrusted.open_dir("runs", state_fd)
    except untrusted.NotRead as exc:
        if exc.errno != errno.ENOENT:
            found.refused.append({"path": visible(runs_path, ascii_only=True),
                                  "owner": owner_of(runs_path), "why": exc.why})
        return
    try:
        runs = untrusted.listing(fd, MAX_RUNS)
        _beyond(found, runs_path, runs, "runs", MAX_RUNS)
        for run in runs.kept:
            if stat.S_ISDIR(run.info.st_mode) and run.name not in pending:
                one = _run(fd, runs_path, run, owner, since, now, found)
                if one is not None:
                    found.runs.append(one)
    except OSError as exc:
        found.unread.append({"path": visible(runs_path, ascii_only=True),
                             "owner": owner_of(runs_path), "why": exc.strerror or str(exc)})
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Owner:
    """The user whose directory records lie in, and that user's uid (None: none here)."""

    name: str
    uid: int | None


def _beyond(found: Found, where: str, listed: untrusted.Listing, what: str,
            limit: int) -> None:
    """Into FOUND: each owner's entries of WHERE beyond the LIMIT read, counted."""
    for uid, n in listed.beyond.items():
        found.refuse(where, uid if isinstance(uid, int) else None,
                     f"{n} more {what} of this owner not read: at most the newest {limit} are")


def _run(runs_fd: int, where: str, run: untrusted.Entry, owner: Owner, since: float,
         now: float, found: Found) -> dict[str, Any] | None:
    """One run's use inside the window, from its nodes' state files; None if none of its
    time falls inside it. A file whose owner is not OWNER is refused."""
    path = os.path.join(where, run.name)
    states = node_states(runs_fd, path, run, owner, found)
    nodes, seconds, gpu_seconds, idle_seconds = [], 0.0, 0.0, 0.0
    starts, ends = [], []
    for state in states:
        counted = part(state, since, now)
        if counted is None:
            continue
        nodes.append(visible(str(state["node"]), ascii_only=True))
        seconds += counted[0]
        gpu_seconds += counted[1]
        idle_seconds += counted[2]
        starts.append(float(state["started"]))
        ends.append(end_of(state, now))
    if not nodes or seconds <= 0:
        return None
    ended = [e for e in ends if e is not None]
    return {"run": visible(run.name, ascii_only=True), "user": owner.name, "nodes": nodes,
            "start": min(starts), "end": max(ended) if len(ended) == len(ends) else None,
            "node_hours": round(seconds / HOUR, 4), "gpu_hours": round(gpu_seconds / HOUR, 4),
            "idle_gpu_hours": round(idle_seconds / HOUR, 4)}


def node_states(runs_fd: int, path: str, run: untrusted.Entry, owner: Owner,
                found: Found) -> list[dict[str, Any]]:
    """The nodes' states in the run's directory PATH that OWNER wrote (the others refused,
    into FOUND): files that are not a node's state (a recovery plan, a decision) left out."""
    try:
        fd = untrusted.open_dir(run.name, runs_fd, seen=run.info)
    except untrusted.NotRead as exc:
        found.refuse(path, exc.uid, exc.why)
        return []
    states = []
    try:
        files = untrusted.listing(fd, MAX_FILES, lambda n: n.endswith(".json"))
        _beyond(found, path, files, "files", MAX_FILES)
        for file in files.kept:
            at = os.path.join(path, file.name)
            if file.info.st_uid != owner.uid:
                found.refuse(at, file.info.st_uid, f"its owner is "
                             f"{user_name(file.info.st_uid)}, not "
                             f"{visible(owner.name, ascii_only=True)}, whose directory it "
                             "lies in: not counted")
                continue
            try:
                state = json.loads(untrusted.read_bytes(file.name, MAX_RECORD, owner.uid, fd))
            except untrusted.NotRead as exc:
                found.refuse(at, exc.uid if exc.uid is not None else file.info.st_uid,
                             exc.why)
                continue
            except ValueError:
                continue   # being written, or not a state
            if isinstance(state, dict) and "node" in state:
                states.append(state)
    except OSError as exc:
        found.unread.append({"path": visible(path, ascii_only=True), "owner": "?",
                             "why": exc.strerror or str(exc)})
    finally:
        os.close(fd)
    return states
