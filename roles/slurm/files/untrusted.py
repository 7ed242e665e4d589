"""Reading what other users wrote on a shared place (the share's checkpoints/, cordons/):
every file and directory there is untrusted. Any user may plant a pipe that blocks its
reader, a link to /dev/zero or to another user's tree, a file of gigabytes, tens of
thousands of files, or text whose escapes rewrite the reader's terminal. So:

- a file is opened without following a link nor waiting on a pipe, read only when it is
  a regular file, of the owner expected, and at most a size limit (`read`);
- a directory is opened without following a link, and, given what was seen of it, only
  when it is still that directory (`open_dir`): a walk never descends through a link
  swapped in meanwhile;
- a listing reads a bounded number of entries per owner, the newest (`listing`): one
  user's flood costs every reader that bound, not the flood;
- text shown to another user has its control and other unprintable characters made
  visible (`visible`).

The standard library only: the slurm role installs it beside cordon.py (root's); it is
also the node package's module orchestrator.node.untrusted (orchestrator/node/__init__.py:
ROLE_MODULES).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class NotRead(Exception):
    """A file or directory of a shared place that is not read: which, whose (its owner's
    uid, None when not known) and why."""

    def __init__(self, path: str, why: str, uid: int | None = None,
                 errno: int | None = None) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why, self.uid, self.errno = path, why, uid, errno


@dataclass(frozen=True)
class Found:
    """A file's bytes and what fstat said of it when it was read."""

    data: bytes
    info: os.stat_result


def _opened(path: str, flags: int, dir_fd: int | None) -> int:
    try:
        return os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP or exc.errno == errno.ENOTDIR and _is_link(path, dir_fd):
            raise NotRead(path, "a symbolic link: not followed") from None
        raise NotRead(path, f"cannot be opened ({exc.strerror})", errno=exc.errno) from None


def _is_link(path: str, dir_fd: int | None) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def read(path: str, limit: int, uid: int | None = None, dir_fd: int | None = None) -> Found:
    """The file PATH (relative to DIR_FD if given): NotRead unless it is a regular file (not
    a link, pipe or device), owned by UID when given, of at most LIMIT bytes."""
    fd = _opened(path, FILE_FLAGS, dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRead(path, "not a regular file (a pipe, a device or a directory)",
                          info.st_uid)
        if uid is not None and info.st_uid != uid:
            raise NotRead(path, f"owned by uid {info.st_uid}, not uid {uid}", info.st_uid)
        chunks, got = [], 0
        while got <= limit:   # st_size may lie (a file growing): count what comes
            chunk = os.read(fd, limit + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise NotRead(path, f"bigger than {limit} bytes", info.st_uid)
        return Found(b"".join(chunks), info)
    except OSError as exc:
        raise NotRead(path, f"cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)


def read_bytes(path: str, limit: int, uid: int | None = None,
               dir_fd: int | None = None) -> bytes:
    """read()'s bytes alone."""
    return read(path, limit, uid, dir_fd).data


def open_dir(path: str, dir_fd: int | None = None,
             seen: os.stat_result | None = None) -> int:
    """A descriptor of the directory PATH (relative to DIR_FD if given), not through a link
    at its end; with SEEN (its lstat when it was listed), NotRead unless it is still that
    directory (one swapped for a link or another directory since)."""
    fd = _opened(path, DIR_FLAGS, dir_fd)
    if seen is not None:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (seen.st_dev, seen.st_ino):
            os.close(fd)
            raise NotRead(path, "replaced while it was read (by a link, or another "
                          "directory): not followed", info.st_uid)
    return fd


def open_below(top: str, parts: tuple[str, ...]) -> int:
    """A descriptor of the directory TOP/PARTS..., TOP opened as given (the caller's) and
    each of PARTS below it without following a link: NotRead for the first that is one,
    or that cannot be opened (its path: TOP and the PARTS up to it)."""
    fd = _opened(top, DIR_FLAGS & ~os.O_NOFOLLOW, None)
    for i, part in enumerate(parts):
        try:
            below = _opened(part, DIR_FLAGS, fd)
        except NotRead as exc:
            raise NotRead(os.path.join(top, *parts[:i + 1]), exc.why, errno=exc.errno) \
                from None
        finally:
            os.close(fd)
        fd = below
    return fd


@dataclass(frozen=True)
class Entry:
    """A directory's entry and its lstat (a link is the link's)."""

    name: str
    info: os.stat_result


def entries(where: str | int, wanted: Callable[[str], bool] | None = None) -> list[Entry]:
    """The entries of the directory WHERE (a path, or a descriptor from open_dir), each
    lstat'ed (not followed); those WANTED refuses by name are not stat'ed. OSError when it
    cannot be listed."""
    found = []
    with os.scandir(where) as it:
        for entry in it:
            if wanted is not None and not wanted(entry.name):
                continue
            try:
                found.append(Entry(entry.name, entry.stat(follow_symlinks=False)))
            except FileNotFoundError:
                continue   # gone meanwhile
    return found


def owner(entry: Entry) -> Hashable:
    return entry.info.st_uid


@dataclass
class Listing:
    """What a bounded listing keeps, and how many entries each group had beyond it."""

    kept: list[Entry]
    beyond: dict[Hashable, int] = field(default_factory=dict)


def bounded(found: list[Entry], limit: int,
            group: Callable[[Entry], Hashable] = owner) -> Listing:
    """At most LIMIT of FOUND per GROUP (by default its owner): the newest (by mtime, then
    name), kept in name order."""
    groups: dict[Hashable, list[Entry]] = {}
    for entry in found:
        groups.setdefault(group(entry), []).append(entry)
    kept: list[Entry] = []
    beyond: dict[Hashable, int] = {}
    for key, mine in groups.items():
        mine.sort(key=lambda e: (e.info.st_mtime_ns, e.name), reverse=True)
        kept += mine[:limit]
        if len(mine) > limit:
            beyond[key] = len(mine) - limit
    return Listing(sorted(kept, key=lambda e: e.name), beyond)


def listing(where: str | int, limit: int,
            wanted: Callable[[str], bool] | None = None) -> Listing:
    """The entries of WHERE, at most LIMIT per owner (the newest): a bounded number of
    files per user per directory."""
    return bounded(entries(where, wanted), limit)


def visible(text: str, ascii_only: bool = False) -> str:
    """TEXT with every character a terminal would not print as itself (controls, format
    characters such as the bidirectional overrides, separators other than the space)
    written as its escape (\\x1b, \\u202e); with ASCII_ONLY every non-ASCII one too (a name:
    a Cyrillic "а" is not an "a")."""
    return "".join(ch if ch == " " or (ch.isprintable() and (ch.isascii() or not ascii_only))
                   else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else \
        f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
