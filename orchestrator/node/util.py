"""Small helpers every node program uses: atomic writes, reading what another process
wrote, and what /proc says of a process (standard library only)."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from typing import Any, NamedTuple

from .cordon import user_name


def detach(log: str, append: bool = False) -> int:
    """Fork: the child's PID in the parent; in the child (0), a session of its own, no
    input, and its output into LOG (truncated, or with APPEND added to)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    redirect(log, append)
    os.setsid()
    return 0


def redirect(log: str, append: bool = False) -> None:
    """This process's input from /dev/null and its output into LOG (truncated, or with
    APPEND added to)."""
    sys.stdout.flush()
    sys.stderr.flush()
    out = os.open(log, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC),
                  0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, to in ((null, 0), (out, 1), (out, 2)):
        os.dup2(fd, to)
    os.close(null)
    os.close(out)


def write_atomically(path: str, data: bytes, mode: int = 0o600, sync: bool = False) -> None:
    """PATH holds DATA whole or not at all (a reader never sees half of it); with SYNC,
    on disk before it is renamed into place (state that must survive a crash)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as fh:
        fh.write(data)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_json(path: str, data: Any, sync: bool = True) -> None:
    """PATH holds DATA as JSON, whole or not at all."""
    write_atomically(path, json.dumps(data).encode(), sync=sync)


def read_json(path: str) -> Any | None:
    """The file's JSON, or None when it is missing or cannot be read (for a moment: a
    writer elsewhere, NFS's ESTALE)."""
    value, _ = read_json_or_why(path)
    return value


def read_json_or_why(path: str) -> tuple[Any, str | None]:
    """(the file's JSON, None) or (None, why it could not be read)."""
    try:
        with open(path) as fh:
            return json.load(fh), None
    except FileNotFoundError:
        return None, f"{path} is missing"
    except (OSError, ValueError) as exc:
        return None, f"{path}: {exc}"


def read_pid(path: str) -> int | None:
    """The PID written in PATH (its first word), None if there is none."""
    try:
        with open(path) as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def environ(pid: int) -> dict[str, str]:
    """Process PID's environment ({} if it cannot be read: gone, or another user's)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


class Proc(NamedTuple):
    """What /proc/PID/stat says of a process."""
    state: str
    ppid: int
    pgrp: int
    rss_pages: int


def parse_stat(text: str) -> tuple[int, Proc]:
    """(pid, Proc) from one /proc/PID/stat line; the command's name, in parentheses, may
    hold spaces and parentheses itself. ValueError, IndexError: not such a line."""
    fields = text[text.rindex(")") + 2:].split()   # from the state on (field 3)
    return int(text[:text.index(" (")]), Proc(fields[0], int(fields[1]), int(fields[2]),
                                              int(fields[21]))


def process_table() -> dict[int, Proc]:
    """Every process that can be read now, from /proc."""
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    pid, proc = parse_stat(fh.read())
            except (OSError, ValueError, IndexError):
                continue   # it ended meanwhile
            procs[pid] = proc
    return procs


def tail_text(path: str, size: int = 65536) -> str:
    """The last SIZE bytes of a file as text ('' if it cannot be read): where a failed
    process's words are."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - size))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def last_lines(path: str, n: int) -> list[str]:
    """The last N non-empty lines of a text file ([] if it cannot be read)."""
    try:
        with open(path, errors="replace") as fh:
            return [line.rstrip() for line in fh.read().splitlines() if line.strip()][-n:]
    except OSError:
        return []


@functools.cache
def owner_of(path: str) -> str:
    """The name of PATH's owner (`?` if it cannot be looked at)."""
    try:
        return user_name(os.lstat(path).st_uid)
    except OSError:
        return "?"


def ago(stamp: float | None, now: float | None = None) -> str:
    """How long before NOW (default: now) STAMP was, as a person says it: `4 min ago`."""
    if stamp is None:
        return "never"
    s = max(0.0, (time.time() if now is None else now) - stamp)
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= length:
            return f"{s / length:.0f} {unit} ago"
    return f"{s:.0f} s ago"
