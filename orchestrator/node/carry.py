"""What a job wrote into its working directory, carried into the next run from the same
work directory (`node.py carry`), as torchrun run by hand twice in one directory finds
the first run's files (PyTorch's DDP tutorial saves snapshot.pt there and resumes from it).

Each run still gets a snapshot of its own (editing the code never changes a running job).
After a run's snapshot is made, the files of the previous snapshot from the same work
directory that the sync did not put there (its manifest lists what it did) are linked
into the new one; copied instead while that run is still running, so two runs never write
one file. A file the code itself now has keeps the code's version, and is said. Each
snapshot's manifest is written first, so that what is carried is carried again next time.
"""

from __future__ import annotations

import os
import shutil
import time

from .protocol import EXIT_FILE, JOBS_SUBDIR, PGID_FILE
from .util import read_pid, write_atomically

MANIFEST = ".clustertrain/manifest"   # in a snapshot: the files the sync put there
LEFT_OUT = (".clustertrain", "__pycache__")
LINKS = ".work"                       # CODE_ROOT/.work/<key>: the latest run of a work dir


def files(root: str) -> set[str]:
    """Every file under ROOT (relative paths), but the snapshot's own and bytecode."""
    found = set()
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in LEFT_OUT]
        for name in names:
            found.add(os.path.relpath(os.path.join(top, name), root))
    return found


def running(state: str, run: str) -> bool:
    """Whether RUN still runs on this node (its job has no exit and its torchrun lives)."""
    job = os.path.join(state, JOBS_SUBDIR, run)
    if os.path.exists(os.path.join(job, EXIT_FILE)):
        return False
    pgid = read_pid(os.path.join(job, PGID_FILE))
    if pgid is None:
        return os.path.isdir(job)  # being launched
    try:
        os.kill(pgid, 0)
        return True
    except OSError:
        return False


def carry(code_root: str, run: str, key: str) -> dict:
    """Write RUN's manifest, carry what the previous run of work directory KEY wrote into
    RUN's snapshot, and make RUN that work directory's latest. What happened, for train."""
    snapshot = os.path.join(code_root, run)
    synced = files(snapshot)
    os.makedirs(os.path.dirname(os.path.join(snapshot, MANIFEST)), exist_ok=True)
    write_atomically(os.path.join(snapshot, MANIFEST), "\n".join(sorted(synced)).encode())
    links = os.path.join(code_root, LINKS)
    os.makedirs(links, exist_ok=True)
    link = os.path.join(links, key)
    previous = os.path.basename(os.readlink(link)) if os.path.islink(link) else None
    done: dict = {"from": None, "carried": [], "kept_code": [], "copied": False}
    if previous and previous != run and os.path.isdir(os.path.join(code_root, previous)):
        before = os.path.join(code_root, previous)
        try:
            with open(os.path.join(before, MANIFEST)) as fh:
                theirs = set(fh.read().split("\n")) - {""}
        except OSError:  # made by an older version: what the job wrote there is not known
            theirs = files(before)
        written = sorted(files(before) - theirs)
        copy = running(os.path.dirname(code_root), previous)
        done.update({"from": previous, "copied": copy})
        for rel in written:
            if rel in synced:
                done["kept_code"].append(rel)
                continue
            src, dst = os.path.join(before, rel), os.path.join(snapshot, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            try:
                if copy:
                    shutil.copy2(src, dst, follow_symlinks=False)
                else:
                    os.link(src, dst, follow_symlinks=False)
            except OSError:
                shutil.copy2(src, dst, follow_symlinks=False)
            done["carried"].append(rel)
    tmp = f"{link}.{os.getpid()}.{time.time_ns()}"
    os.symlink(os.path.join("..", run), tmp)
    os.replace(tmp, link)
    return done


def kept(code_root: str) -> set[str]:
    """The runs some work directory's next run carries from: never pruned."""
    links = os.path.join(code_root, LINKS)
    try:
        return {os.path.basename(os.readlink(os.path.join(links, k)))
                for k in os.listdir(links)}
    except OSError:
        return set()
