"""A user's usage ledger on the share (checkpoints/USER/.clustertrain/usage-ledger.json):
the daily totals of that user's runs whose records were folded away (fold.py), which
`usage` (usage.py) counts where their records are gone. Its form:

  {"version": 1, "generation": N, "pending": [run ids],
   "days": {"YYYY-MM-DD": {"runs": n, "node_s": s, "gpu_s": s, "idle_gpu_s": s}}}

- A day is a UTC date. A folded run's node-, GPU- and idle GPU-seconds go to the days they
  fell on, counted by usage.py's own `part` over each day, and the run counts as one on the
  day it started. A window (SINCE..now) counts a day whole when its middle lies inside:
  folded runs are counted by the day (the runs still on the share, to the second), and
  have no line of their own in `usage --runs`.
- PENDING are the runs the days count whose directories may still be on the share: a fold
  writes the ledger first and removes their directories after, so a fold cut short between
  the two leaves runs both counted and there. `usage` skips the records of a pending run;
  the next fold removes its directory without counting it again, and drops from PENDING
  the runs whose directories are gone. So a run is counted by the days exactly from the
  writing that names it pending: never twice, never lost. PENDING holds at most
  MAX_PENDING runs (a fold folds no more while it is full), and the days grow by one a day.
  (Keeping each folded run's own totals, the days rebuilt from them, would be idempotent
  too, but would grow with every run, as the records did.)
- GENERATION goes up at each writing: a reader that finds another generation after it read
  the records reads them again (a fold went by meanwhile).
- Only a fold that holds the ledger's lock writes it (`Lock`: a directory made beside it
  with os.mkdir, atomic on NFS too; stale after LOCK_STALE without its holder's refresh,
  and checked to be still its holder's before each writing), whole and at once
  (util.write_atomically), read again under the lock before anything is added to it.

Read as every file on the share is (untrusted.py): no link followed, at most MAX_LEDGER
bytes, owned by the user whose directory it lies in, or refused (NotRead); a ledger that
is not of this form is refused too (ValueError), never rewritten.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import socket
import time
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

from . import untrusted
from .util import write_atomically

LEDGER = "usage-ledger.json"   # in checkpoints/USER/.clustertrain/
LOCK = "usage-ledger.lock"     # a directory beside it: the fold that made it writes
VERSION = 1
MAX_LEDGER = 4 << 20    # bytes: a day is under 100, and pending runs' ids under 100 each
MAX_PENDING = 4096      # runs counted whose directories are not gone yet
LOCK_STALE = 300.0      # seconds: a lock not refreshed this long is its dead fold's
DAY = 86400.0
DAY_NAME = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass
class Day:
    """One UTC day's folded runs: how many started then, and the seconds of each kind
    that fell on it."""

    runs: int = 0
    node_s: float = 0.0
    gpu_s: float = 0.0
    idle_gpu_s: float = 0.0

    def add(self, other: Day) -> None:
        self.runs += other.runs
        self.node_s += other.node_s
        self.gpu_s += other.gpu_s
        self.idle_gpu_s += other.idle_gpu_s


@dataclass
class Ledger:
    """A user's ledger (see the module's words)."""

    days: dict[str, Day] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    generation: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "generation": self.generation, "pending": self.pending,
                "days": {d: {f.name: round(getattr(day, f.name), 3) for f in fields(Day)}
                         for d, day in sorted(self.days.items())}}

    @classmethod
    def from_json(cls, data: Any) -> Ledger:
        """The ledger in DATA; ValueError saying what is wrong with it."""
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"its version is not {VERSION}")
        generation, pending, days = data.get("generation"), data.get("pending"), \
            data.get("days")
        if not isinstance(generation, int) or isinstance(generation, bool):
            raise ValueError("its generation is not a number")
        if not isinstance(pending, list) or not all(isinstance(p, str) for p in pending):
            raise ValueError("its pending runs are not a list of run ids")
        if not isinstance(days, dict):
            raise ValueError("its days are not an object")
        found = {}
        for name, day in days.items():
            if not DAY_NAME.fullmatch(name) or not isinstance(day, dict):
                raise ValueError(f"day {name!r} is not YYYY-MM-DD with its totals")
            for f in fields(Day):
                value = day.get(f.name)
                kind = int if f.name == "runs" else (int, float)
                if not isinstance(value, kind) or isinstance(value, bool) or value < 0:
                    raise ValueError(f"day {name}: {f.name} is not a number of zero or more")
            found[name] = Day(day["runs"], float(day["node_s"]), float(day["gpu_s"]),
                              float(day["idle_gpu_s"]))
        return cls(found, list(pending), generation)

    def window(self, since: float, now: float) -> tuple[Day, list[str]]:
        """The days whose middle lies in [SINCE, NOW], summed, and their names."""
        total, names = Day(), []
        for name, day in sorted(self.days.items()):
            if since <= start_of(name) + DAY / 2 <= now:
                total.add(day)
                names.append(name)
        return total, names


def day_of(t: float) -> str:
    """The UTC date of the moment T."""
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d")


def start_of(day: str) -> float:
    """The first moment of the UTC date DAY."""
    return datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()


def read(dir_fd: int, uid: int | None) -> tuple[Ledger | None, os.stat_result | None]:
    """The ledger in the directory DIR_FD (a user's .clustertrain) and its file's status;
    (None, None) where there is none. untrusted.NotRead for one that is a link, not a
    regular file, too big, or not UID's (its `uid` says whose); ValueError for one that is
    not a ledger."""
    try:
        found = untrusted.read(LEDGER, MAX_LEDGER, None, dir_fd)
    except untrusted.NotRead as exc:
        if exc.errno == errno.ENOENT:   # no ledger yet
            return None, None
        raise
    if found.info.st_uid != uid:
        raise untrusted.NotRead(LEDGER, f"owned by uid {found.info.st_uid}, not uid {uid}",
                                found.info.st_uid)
    try:
        data = json.loads(found.data)
    except ValueError:
        raise ValueError("not JSON") from None
    return Ledger.from_json(data), found.info


def write(where: str, ledger: Ledger) -> None:
    """LEDGER into the directory WHERE, its generation one up, whole and on disk."""
    ledger.generation += 1
    write_atomically(os.path.join(where, LEDGER), json.dumps(ledger.to_json()).encode(),
                     sync=True)


class Lock:
    """The ledger's lock: the directory LOCK beside it, made with os.mkdir (which one
    process alone succeeds in, on NFS too), holding its holder's token. A lock whose
    directory was not refreshed for LOCK_STALE is its dead holder's and is broken; a
    holder checks that it still holds the lock (`held`) before each writing of the
    ledger, and stops when it does not."""

    def __init__(self, where: str) -> None:
        self.path = os.path.join(where, LOCK)
        self.token = f"{socket.gethostname()} {os.getpid()} {secrets.token_hex(8)}"

    def take(self, now: float | None = None) -> bool:
        """Whether this process holds the lock now (False: another holds it)."""
        for _ in range(2):
            try:
                os.mkdir(self.path, 0o700)
            except FileExistsError:
                if not self._break_stale(time.time() if now is None else now):
                    return False
                continue
            try:
                fd = os.open(os.path.join(self.path, "holder"),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with open(fd, "w") as fh:
                    fh.write(self.token)
            except OSError:
                return False   # broken meanwhile by one who took it for stale: not ours
            return True
        return False

    def held(self) -> bool:
        """Whether the lock is still this process's (nobody broke it)."""
        try:
            fd = os.open(os.path.join(self.path, "holder"), os.O_RDONLY | os.O_NOFOLLOW)
            with open(fd) as fh:
                return fh.read(200) == self.token
        except OSError:
            return False

    def refresh(self) -> None:
        """Say the holder is alive: the lock is not stale for another LOCK_STALE."""
        try:
            os.utime(self.path)
        except OSError:
            pass

    def release(self) -> None:
        if self.held():
            self._remove()

    def _break_stale(self, now: float) -> bool:
        """Remove the lock if it is stale (True: it was, or is gone already)."""
        try:
            if now - os.lstat(self.path).st_mtime <= LOCK_STALE:
                return False
        except FileNotFoundError:
            return True
        except OSError:
            return False
        self._remove()
        return True

    def _remove(self) -> None:
        # Renamed away first, then removed: another that finds the lock stale meanwhile
        # renames nothing, or a lock of its own that it then finds not held.
        away = f"{self.path}.gone-{secrets.token_hex(6)}"
        try:
            os.rename(self.path, away)
        except OSError:
            return
        shutil.rmtree(away, ignore_errors=True)
