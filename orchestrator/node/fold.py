"""Old run records folded into their user's usage ledger (issue 69): each run leaves its
nodes' states on the share (checkpoints/USER/.clustertrain/runs/RUN/), which nothing else
removes and `usage` reads every time. When a run starts, its node 0's supervisor (the
run's user, in a thread of its own: never on the way of the start) folds that user's runs
whose every part ended more than FOLD_AFTER ago into the user's ledger (ledger.py: daily
totals, counted with usage.py's own `part`, so that `usage` gives the same hours), then
removes their directories.

- Ended is usage.py's rule (end_of): a part's end, or the last writing of a part whose
  supervisor went silent for STATE_STALE. A run folds only when every part ended more
  than FOLD_AFTER ago, its last writing too, and nothing in its directory (or one level
  below: hang dumps, a recovery's plan and standbys) changed since; a detached run's
  attempts (RUN, RUN.r1, ...) fold together or not at all, since the later ones read the
  first one's plan. A run with a record `usage` refuses (another's file, a link) is left
  as it is, where `usage` goes on saying so.
- Only the user's own directories are folded (this process's user: checkpoints/ME), and
  only while this process holds the ledger's lock (ledger.Lock): two runs that start at
  once on two nodes fold one after the other, the second finding nothing left to fold or
  the lock taken (it leaves the fold to the first).
- A run's directory goes only after the ledger that counts it is written (ledger.py's
  PENDING): a fold cut short anywhere counts no run twice and loses none.

At most BATCH runs are counted per writing of the ledger, MAX_FOLD per start.
"""

from __future__ import annotations

import errno
import os
import pwd
import re
import shutil
import stat
import time
import traceback
from dataclasses import dataclass, field

from . import ledger, untrusted
from .ledger import Day, Ledger, Lock
from .protocol import NODE_STATE_DIR
from .usage import MAX_FILES, Found, Owner, end_of, node_states, part

FOLD_AFTER = 30 * 86400.0   # seconds since a run's last end (and any writing of its files)
BATCH = 200                 # runs counted per writing of the ledger
MAX_FOLD = 2000             # runs folded per fold (the rest at a later start)
MAX_DAYS = 3660             # a run spread over more days than this is no run: left as is
ATTEMPT = re.compile(r"\.r\d+$")   # a detached run's later attempt: RUN.rN (recover.py)


@dataclass
class Folded:
    """What a fold did: the runs it counted into the ledger, the directories it removed,
    why it stopped short (a ledger it leaves alone, a lock broken: said in the supervisor's
    log), or why it had nothing to do (another fold holds the lock: said nowhere)."""

    counted: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    stopped: str | None = None
    skipped: str | None = None


def fold_for(state_dir: str, now: float | None = None) -> Folded:
    """The fold of the user whose run's state directory STATE_DIR is
    (SHARE/checkpoints/USER/.clustertrain/runs/RUN): nothing unless USER is this process's
    user."""
    runs = os.path.dirname(os.path.normpath(state_dir))
    mine = os.path.dirname(runs)
    user_dir = os.path.dirname(mine)
    checkpoints = os.path.dirname(user_dir)
    me = pwd.getpwuid(os.getuid()).pw_name
    if (os.path.basename(runs), os.path.basename(mine), os.path.basename(user_dir),
            os.path.basename(checkpoints)) != ("runs", NODE_STATE_DIR, me, "checkpoints"):
        return Folded(skipped=f"{state_dir} is not a run's state directory of {me}")
    return fold(os.path.dirname(checkpoints), now)


def fold_quietly(state_dir: str) -> None:
    """fold_for, said in this process's output (the supervisor's log) when it did anything
    or failed; a fold that fails leaves the run alone."""
    try:
        done = fold_for(state_dir)
    except Exception:  # noqa: BLE001 - a fold that fails is said, never the run's end
        traceback.print_exc()
        return
    if done.counted or done.removed or done.stopped:
        print(f"{time.strftime('%H:%M:%S')} usage ledger: {len(done.counted)} old runs "
              f"folded, {len(done.removed)} directories removed"
              + (f"; {done.stopped}" if done.stopped else ""), flush=True)


def fold(share: str, now: float | None = None) -> Folded:
    """Fold this process's user's runs on SHARE that ended FOLD_AFTER ago into the user's
    ledger, and remove their directories (see the module's words)."""
    now = time.time() if now is None else now
    uid = os.getuid()
    owner = Owner(pwd.getpwuid(uid).pw_name, uid)
    top = os.path.join(share, "checkpoints")
    where = os.path.join(top, owner.name, NODE_STATE_DIR)
    try:
        state_fd = untrusted.open_below(top, (owner.name, NODE_STATE_DIR))
    except untrusted.NotRead as exc:
        return Folded(stopped=None if exc.errno == errno.ENOENT else exc.why)
    try:
        if os.fstat(state_fd).st_uid != uid:
            return Folded(stopped=f"{where} is not {owner.name}'s")
        lock = Lock(where)
        if not lock.take():
            return Folded(skipped="another fold holds the ledger's lock")
        try:
            return _fold(state_fd, where, owner, lock, now)
        finally:
            lock.release()
    finally:
        os.close(state_fd)


def _fold(state_fd: int, where: str, owner: Owner, lock: Lock, now: float) -> Folded:
    """The fold, its lock held."""
    done = Folded()
    try:
        book = ledger.read(state_fd, owner.uid)[0] or Ledger()
    except (untrusted.NotRead, ValueError) as exc:
        why = exc.why if isinstance(exc, untrusted.NotRead) else str(exc)
        done.stopped = f"the ledger {os.path.join(where, ledger.LEDGER)} is left as it is: {why}"
        return done
    try:
        runs_fd = untrusted.open_dir("runs", state_fd)
    except untrusted.NotRead as exc:
        done.stopped = None if exc.errno == errno.ENOENT else exc.why
        return done
    runs = os.path.join(where, "runs")
    try:
        dirty = _remove(runs, book, done)   # counted by a fold cut short: removed now
        since_written, refreshed = 0, time.monotonic()
        for chain in _candidates(runs_fd, owner, set(book.pending), now):
            if len(done.counted) >= MAX_FOLD:
                break
            if time.monotonic() - refreshed > ledger.LOCK_STALE / 10:
                lock.refresh()   # alive: a share slow to read is no dead fold
                refreshed = time.monotonic()
            if len(book.pending) + len(chain) > ledger.MAX_PENDING:
                done.stopped = (f"{len(book.pending)} folded runs' directories could not be "
                                "removed: no more runs are folded")
                break
            days = _counted(runs_fd, runs, chain, owner, now)
            if days is None:
                continue
            for name, day in days.items():
                book.days.setdefault(name, Day()).add(day)
            names = [entry.name for entry in chain]
            book.pending += names
            done.counted += names
            dirty, since_written = True, since_written + len(names)
            if since_written >= BATCH:
                if not _write(where, book, lock, done):
                    return done
                dirty, since_written = _remove(runs, book, done), 0
        if dirty and _write(where, book, lock, done) and _remove(runs, book, done):
            _write(where, book, lock, done)   # the runs removed leave PENDING
    finally:
        os.close(runs_fd)
    return done


def _write(where: str, book: Ledger, lock: Lock, done: Folded) -> bool:
    """BOOK written, if this fold still holds the lock (False, said in DONE: it does not,
    and writes nothing more)."""
    if not lock.held():
        done.stopped = "the ledger's lock was broken (this fold was taken for dead): stopped"
        return False
    ledger.write(where, book)
    lock.refresh()
    return True


def _remove(runs: str, book: Ledger, done: Folded) -> bool:
    """The directories of BOOK's pending runs, removed (the ledger that counts them is on
    the share); those gone leave PENDING (written at the ledger's next writing). Whether
    any left it."""
    kept = []
    for name in book.pending:
        path = os.path.join(runs, name)
        shutil.rmtree(path, ignore_errors=True)
        try:
            os.lstat(path)
        except FileNotFoundError:
            done.removed.append(name)
            continue
        except OSError:
            pass
        kept.append(name)
    left = len(kept) < len(book.pending)
    book.pending = kept
    return left


def _candidates(runs_fd: int, owner: Owner, pending: set[str], now: float
                ) -> list[list[untrusted.Entry]]:
    """OWNER's run directories in RUNS_FD not changed for FOLD_AFTER, by chain (a run and
    its later attempts), the oldest first; a chain with any attempt changed since, not
    OWNER's or not a directory, is left out whole."""
    chains: dict[str, list[untrusted.Entry]] = {}
    for entry in untrusted.entries(runs_fd):
        if entry.name.startswith(".") or entry.name in pending:
            continue
        chains.setdefault(ATTEMPT.sub("", entry.name), []).append(entry)
    old = [chain for chain in chains.values()
           if all(stat.S_ISDIR(e.info.st_mode) and e.info.st_uid == owner.uid
                  and now - e.info.st_mtime > FOLD_AFTER for e in chain)]
    return sorted(old, key=lambda chain: max(e.info.st_mtime for e in chain))


def _counted(runs_fd: int, runs: str, chain: list[untrusted.Entry], owner: Owner,
             now: float) -> dict[str, Day] | None:
    """The days of CHAIN's runs (usage.py's figures, day by day), or None when one of them
    is not to be folded: a part not ended FOLD_AFTER ago, a file of it written since, a
    record `usage` refuses."""
    days: dict[str, Day] = {}
    for entry in chain:
        path = os.path.join(runs, entry.name)
        if not _quiet_since(runs_fd, entry, now - FOLD_AFTER):
            return None
        found = Found()
        states = node_states(runs_fd, path, entry, owner, found)
        if found.refused or found.unread:
            return None
        run = _days(states, now)
        if run is None:
            return None
        for name, day in run.items():
            days.setdefault(name, Day()).add(day)
    return days


def _days(states: list[dict], now: float) -> dict[str, Day] | None:
    """One run's seconds by UTC day, and its count on the day it started, as usage.py
    counts it over all time (`part` over each day); None while a part has not ended
    FOLD_AFTER ago (or spreads over more than MAX_DAYS)."""
    days: dict[str, Day] = {}
    starts, total = [], 0.0
    for state in states:
        end = end_of(state, now)
        last = max([t for t in (end, state.get("time"), state.get("ended"))
                    if isinstance(t, (int, float))], default=None)
        if end is None or last is None or now - last <= FOLD_AFTER:
            return None
        whole = part(state, 0.0, now)
        if whole is None:
            continue   # no start: usage counts nothing of it
        started = float(state["started"])
        day = ledger.start_of(ledger.day_of(started))
        if (min(float(last), now) - day) / ledger.DAY > MAX_DAYS:
            return None
        while day < min(float(last), now):
            counted = part(state, day, min(day + ledger.DAY, now))
            if counted is not None and counted[0] > 0:
                d = days.setdefault(ledger.day_of(day), Day())
                d.node_s += counted[0]
                d.gpu_s += counted[1]
                d.idle_gpu_s += counted[2]
            day += ledger.DAY
        starts.append(started)
        total += whole[0]
    if starts and total > 0:   # usage counts a run with a node and time (usage._run)
        days.setdefault(ledger.day_of(min(starts)), Day()).runs += 1
    return days


def _quiet_since(runs_fd: int, entry: untrusted.Entry, since: float) -> bool:
    """Nothing in the run's directory ENTRY, or in its directories (hang/, recovery/),
    changed after SINCE."""
    try:
        fd = untrusted.open_dir(entry.name, runs_fd, seen=entry.info)
    except untrusted.NotRead:
        return False
    try:
        found = untrusted.entries(fd)
        if len(found) > MAX_FILES:
            return False
        for inner in found:
            if inner.info.st_mtime > since:
                return False
            if stat.S_ISDIR(inner.info.st_mode):
                below = untrusted.open_dir(inner.name, fd, seen=inner.info)
                try:
                    deeper = untrusted.entries(below)
                finally:
                    os.close(below)
                if len(deeper) > MAX_FILES or any(d.info.st_mtime > since for d in deeper):
                    return False
        return True
    except (OSError, untrusted.NotRead):
        return False
    finally:
        os.close(fd)
