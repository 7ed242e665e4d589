"""Free space where runs write, and a run that died of its lack.

`space` measures each place (preflight's check, node/preflight.py). `out_of_space` is the
supervisor's word on a torchrun that failed: when its ranks' last output says the disk
was full (ENOSPC or EDQUOT in Python's words, or torch.save's "unexpected pos", which is
how a full disk shows through its writer), it names the fullest of the places the job
wrote to, with its figures now, as one line of the node's log (NO_SPACE_MARKER): the
controller puts it into the run's error and its record (record/ends.py).
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

from .protocol import NO_SPACE_MARKER
from .util import tail_text

# How a full disk (or a full quota) shows in a rank's output.
NO_SPACE = re.compile(r"No space left on device|\[Errno 28\]|Disk quota exceeded|"
                      r"\[Errno 122\]|inline_container\.cc.*unexpected pos")
# Python's OSError names the file when it has one: "...: '/path/file'".
NAMED = re.compile(r"(?:No space left on device|Disk quota exceeded): '([^']+)'")
MEASURE_WAIT = 2.0   # seconds: a share that stalls must not hold the node's end


def space(places: dict[str, str]) -> list[dict[str, Any]]:
    """Free space and inodes of each of PLACES ({what: path}), one entry per filesystem
    (the first place named on it): what, path, and free, total (bytes), ifree, itotal."""
    found: list[dict[str, Any]] = []
    seen: set[int] = set()
    for what, path in places.items():
        try:
            dev = os.stat(path).st_dev
            st = os.statvfs(path)
        except OSError as exc:
            found.append({"what": what, "path": path, "error": exc.strerror})
            continue
        if dev in seen:
            continue
        seen.add(dev)
        found.append({"what": what, "path": path, "free": st.f_bavail * st.f_frsize,
                      "total": st.f_blocks * st.f_frsize, "ifree": st.f_favail,
                      "itotal": st.f_files})
    return found


def size(n: int) -> str:
    """N bytes in the unit a person reads: GiB from one GiB up, else MiB (KiB below)."""
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def temp_dir() -> str:
    """Where a process's temporary files go: $TMPDIR (or $TEMP, $TMP), else /tmp. Not
    tempfile.gettempdir(): it skips a directory it cannot write a file into, and a full
    one is the one to measure."""
    return next((os.environ[v] for v in ("TMPDIR", "TEMP", "TMP") if os.environ.get(v)), "/tmp")


def mount_of(path: str) -> str:
    """The mount point PATH is on (PATH itself if it is one)."""
    path = os.path.realpath(path)
    while not os.path.ismount(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def out_of_space(log: str, share: str | None) -> str | None:
    """The note for a failed torchrun whose output LOG ends in a full disk's words: the
    fullest of the file the error named, the share (SHARE: a directory on it), the home
    and the temporary directory; None when the output says nothing of space."""
    text = tail_text(log)
    if not NO_SPACE.search(text):
        return None
    places: dict[str, str] = {}
    named = NAMED.findall(text)
    if named:
        wrote = named[-1]
        places["the file it wrote"] = wrote if os.path.isdir(wrote) else \
            os.path.dirname(wrote) or "."
    if share:
        places["the share"] = mount_of(share)
    places.update({"home": os.path.expanduser("~"), "temporary files": temp_dir()})
    found = _measured(places)
    known = [p for p in found if p.get("total")]
    if not known:
        return f"{NO_SPACE_MARKER} its output says a disk was full; free space unknown"
    full = min(known, key=_room)
    inodes = _room(full) < full["free"] / full["total"]   # its inodes ran out first
    figures = (f"{full['ifree']} inodes free of {full['itotal']}" if inodes
               else f"{size(full['free'])} free of {size(full['total'])}")
    return f"{NO_SPACE_MARKER} {full['path']} ({full['what']}) has {figures}"


def _room(place: dict[str, Any]) -> float:
    """The share of PLACE still free: of its bytes, or of its inodes if fewer."""
    room = place["free"] / place["total"]
    return min(room, place["ifree"] / place["itotal"]) if place["itotal"] else room


def _measured(places: dict[str, str]) -> list[dict[str, Any]]:
    """space(PLACES), or [] if it takes longer than MEASURE_WAIT (a stalled share)."""
    found: list[list[dict[str, Any]]] = []
    t = threading.Thread(target=lambda: found.append(space(places)), daemon=True)
    t.start()
    t.join(MEASURE_WAIT)
    return found[0] if found else []
