"""The sandbox's share as each node sees it: the share directory served to each training
node through a FUSE passthrough of its own (unionfs-fuse), so that the share can stall as
an NFS mount does when its server is busy or failing over: `stall` stops that node's FUSE
daemon (SIGSTOP) and every access to the share on the node blocks until it resumes.

The host holds one daemon per node, mounted at STATE/share-mounts/<node> and bind-mounted
into the node at the share's path; `unmount` (sandbox down) takes them away.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from ..errors import SandboxError
from .layout import SandboxSpec

UNIONFS = "unionfs"
MOUNT_TIMEOUT = 10.0
ANSWER_TIMEOUT = 30.0   # after a stall, the share must answer again within this


def mounts_dir(state_dir: Path) -> Path:
    return state_dir / "share-mounts"


def mount_point(state_dir: Path, node: str) -> Path:
    return mounts_dir(state_dir) / node


def _pid_file(state_dir: Path, node: str) -> Path:
    return mounts_dir(state_dir) / f"{node}.pid"


def check_tools() -> None:
    """What a sandbox's share needs on the host, before any container is made."""
    if shutil.which(UNIONFS) is None or not os.path.exists("/dev/fuse"):
        raise SandboxError(
            "the sandbox serves its share to each node through FUSE (unionfs-fuse), and "
            f"{'/dev/fuse is missing' if shutil.which(UNIONFS) else 'unionfs is not installed'}"
            " on this machine; install it with `sudo apt-get install -y unionfs-fuse fuse3` "
            "(`make deps` does)")


def mount(spec: SandboxSpec, node: str) -> Path:
    """Serve the share to NODE through a FUSE daemon of its own; return the mount point."""
    point = mount_point(spec.state_dir, node)
    point.mkdir(parents=True, exist_ok=True)
    log = open(mounts_dir(spec.state_dir) / f"{node}.log", "ab")  # noqa: SIM115 - the daemon's, kept
    with log:
        # -f: in the foreground of its own session, so its PID is the daemon's to stop.
        proc = subprocess.Popen(
            [UNIONFS, "-f", "-o", "allow_other,cow", f"{spec.share_dir}=RW", str(point)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    _pid_file(spec.state_dir, node).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + MOUNT_TIMEOUT
    while not os.path.ismount(point):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SandboxError(f"the share's FUSE mount for {node} did not come up at {point}"
                               f" (see {mounts_dir(spec.state_dir) / f'{node}.log'})")
        time.sleep(0.05)
    return point


def _pid(state_dir: Path, node: str) -> int | None:
    try:
        return int(_pid_file(state_dir, node).read_text())
    except (OSError, ValueError):
        return None


def unmount(state_dir: Path) -> list[str]:
    """Take every node's share mount away (resuming a stalled one first)."""
    done: list[str] = []
    if not mounts_dir(state_dir).is_dir():
        return done
    for pid_file in sorted(mounts_dir(state_dir).glob("*.pid")):
        node = pid_file.stem
        pid = _pid(state_dir, node)
        if pid is not None:
            _signal(pid, signal.SIGCONT)
        subprocess.run(["fusermount", "-u", "-z", str(mount_point(state_dir, node))],
                       capture_output=True, check=False)
        if pid is not None:
            _signal(pid, signal.SIGTERM)
        done.append(node)
    return done


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stall(spec: SandboxSpec, seconds: float, nodes: list[str] | None = None) -> list[str]:
    """Block every access to the share on NODES (every training node by default) for
    SECONDS, then resume it and return once it answers again on each of them."""
    names = [n.name for n in spec.members() if not n.outsider and
             mount_point(spec.state_dir, n.name).is_dir()]
    chosen = nodes or names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        raise SandboxError(f"sandbox {spec.name} has no share mount on {', '.join(unknown)}; "
                           f"its nodes with one: {', '.join(names)}")
    pids = {}
    for node in chosen:
        pid = _pid(spec.state_dir, node)
        if pid is None:
            raise SandboxError(f"{node}: the share's FUSE daemon is not known "
                               f"({_pid_file(spec.state_dir, node)}); was the sandbox made "
                               "by this version?")
        pids[node] = pid
    for pid in pids.values():
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        for pid in pids.values():
            _signal(pid, signal.SIGCONT)
    for node in chosen:
        _wait_answers(mount_point(spec.state_dir, node))
    return chosen


def _wait_answers(point: Path) -> None:
    answered = threading.Event()

    def look() -> None:
        os.listdir(point)
        answered.set()

    threading.Thread(target=look, daemon=True).start()
    if not answered.wait(ANSWER_TIMEOUT):
        raise SandboxError(f"the share at {point} did not answer within {ANSWER_TIMEOUT:g} s "
                           "of its resume")
