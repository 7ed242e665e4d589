"""What the soak looks at on the nodes while it runs, every minute and at its end: the
processes of runs (each carries its run's id in its environment, CLUSTERTRAIN_RUN_ID) and
the memory, open files and threads of the nodes' long-lived processes; on the host, the
bytes of the share's records. As shell run in a node's container (`podman exec`, as root)
and parsers of what it prints, so that both are tested without a cluster.

A process's environment is readable only by its own user (root in the container lacks
CAP_SYS_PTRACE), so the scan runs once per login user (runuser).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from pathlib import Path

from .history import ProcessSeen, Sample

# The nodes' long-lived processes, by their process name (pgrep -x): sampled each minute.
DAEMONS = ("slurmd", "slurmctld", "slurmdbd", "munged", "sshd", "ganesha.nfsd",
           "systemd-journal", "mariadbd")
# What the share's records are not: data, wheels, checkpoints (counted by `du`, not here).
NOT_RECORDS = ("wheelhouse", "data")
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt")

_STAT = ("rss=$(awk '/^VmRSS/{print $2}' /proc/$p/status 2>/dev/null); "
         "th=$(awk '/^Threads/{print $2}' /proc/$p/status 2>/dev/null); "
         "fds=$(ls /proc/$p/fd 2>/dev/null | wc -l); ")


def scan_script(users: Iterable[str]) -> str:
    """Shell printing one line per process of a run, as each of USERS sees its own:
    `PID USER RUN_ID RSS_KB THREADS FDS COMMAND`."""
    inner = ("for e in /proc/[0-9]*/environ; do "
             "r=$(tr '\\0' '\\n' < \"$e\" 2>/dev/null | grep -m1 '^CLUSTERTRAIN_RUN_ID=') || "
             "continue; p=${e#/proc/}; p=${p%/environ}; " + _STAT +
             "c=$(tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-120); "
             "echo \"$p $(id -un) ${r#*=} ${rss:-0} ${th:-0} $fds $c\"; done")
    return "; ".join(f"runuser -u {shlex.quote(u)} -- sh -c {shlex.quote(inner)}"
                     for u in users) + "; true"


def parse_scan(text: str, node: str, t: float) -> list[tuple[ProcessSeen, Sample]]:
    """SCAN_SCRIPT's lines as the processes seen on NODE at T, each with its sample."""
    found = []
    for line in text.splitlines():
        parts = line.split(" ", 6)
        if len(parts) < 6 or not parts[0].isdigit():
            continue
        pid, user, run_id, rss, threads, fds = parts[:6]
        command = parts[6].strip() if len(parts) > 6 else ""
        seen = ProcessSeen(t, node, int(pid), run_id, user, command)
        role = "supervisor" if "supervise" in command else _role(command)
        sample = Sample(t, f"{role} {node} {run_id}", rss=_int(rss) * 1024,
                        fds=_int(fds), threads=_int(threads))
        found.append((seen, sample))
    return found


def _role(command: str) -> str:
    if "torchrun" in command:
        return "torchrun"
    return "worker" if "python" in command else "process"


def daemons_script(names: Iterable[str] = DAEMONS) -> str:
    """Shell printing `NAME PID RSS_KB THREADS FDS` for the oldest process of each NAME."""
    return ("for n in " + " ".join(shlex.quote(n) for n in names) + "; do "
            "p=$(pgrep -o -x \"$n\") || continue; " + _STAT +
            "echo \"$n $p ${rss:-0} ${th:-0} $fds\"; done; true")


def parse_daemons(text: str, node: str, t: float) -> list[Sample]:
    found = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 5 or not parts[1].isdigit():
            continue
        name, _, rss, threads, fds = parts
        found.append(Sample(t, f"{name} {node}", rss=_int(rss) * 1024, fds=_int(fds),
                            threads=_int(threads)))
    return found


def records_bytes(share: Path) -> int:
    """The bytes of the share's records: every file but the data, the wheels and the
    checkpoints (run states, cordons, ledgers, logs kept on the share)."""
    total = 0
    for top, dirs, files in os.walk(share):
        if Path(top) == share:
            dirs[:] = [d for d in dirs if d not in NOT_RECORDS]
        for name in files:
            if name.endswith(CHECKPOINT_SUFFIXES):
                continue
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                continue
    return total


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0
