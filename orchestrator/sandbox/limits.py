"""Host limits a sandbox runs into, checked before anything is created.

Every node is a container booting systemd, and systemd, systemd-logind and dbus-daemon
each hold inotify instances; the kernel allows each user fs.inotify.max_user_instances
of them (128 by default). Past that limit systemd's .path units fail at boot and the
node comes up 'degraded': a 16-node sandbox fits, a second one beside it does not.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SandboxError

MAX_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
# Measured on a booted node: systemd 4, systemd-logind 1, dbus-daemon 1.
INOTIFY_PER_CONTAINER = 6


def inotify_in_use(uid: int | None = None, proc: Path = Path("/proc")) -> int:
    """Inotify instances held by the processes of UID (default: ours) that we can read."""
    uid = os.getuid() if uid is None else uid
    count = 0
    for pid in proc.iterdir():
        if not pid.name.isdigit():
            continue
        try:
            if pid.stat().st_uid != uid:
                continue
            for fd in (pid / "fd").iterdir():
                if os.readlink(fd) == "anon_inode:inotify":
                    count += 1
        except OSError:  # the process ended, or its fds are not ours to read
            continue
    return count


def check_inotify(containers: int, in_use: int, limit: int) -> None:
    """Refuse a sandbox whose CONTAINERS would run out of inotify instances."""
    need = containers * INOTIFY_PER_CONTAINER
    if in_use + need <= limit:
        return
    enough = max(1024, 2 ** (in_use + need).bit_length())
    raise SandboxError(
        f"{containers} containers need about {need} inotify instances and {in_use} of this "
        f"user's {limit} (fs.inotify.max_user_instances) are already in use: the nodes would "
        "boot 'degraded'.\nRaise the limit (as root): sysctl -w fs.inotify.max_user_instances="
        f"{enough}  (to keep it: echo fs.inotify.max_user_instances={enough} > "
        "/etc/sysctl.d/60-clustertrain-sandbox.conf), or take other sandboxes down first "
        "(python -m orchestrator sandbox list).")


def check_host(containers: int) -> None:
    """Every host limit, before a sandbox of CONTAINERS containers is created."""
    check_inotify(containers, inotify_in_use(), int(MAX_INSTANCES.read_text()))
