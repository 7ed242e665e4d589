"""Slurm's own accounting of who used the cluster (`node.py usage --sacct`): node- and
GPU-hours per user from `sacct`, for the same window as the runs' records. It counts every
allocation, whatever started it (a user's own sbatch too), so `usage` shows it beside the
records as Slurm's word. A user sees his own jobs; root (`usage --all`) every user's.
"""

from __future__ import annotations

import os
import subprocess
from datetime import datetime
from typing import Any

HOUR = 3600.0
FIELDS = ("JobID", "User", "NNodes", "AllocTRES", "Start", "End")
TIMEOUT = 60.0


def command(since: float, everyone: bool) -> list[str]:
    """sacct's allocations (-X) that ran in the window from SINCE to now, one line each,
    '|'-separated (-P), in the node's local time."""
    start = datetime.fromtimestamp(since).strftime("%Y-%m-%dT%H:%M:%S")
    return ["sacct", "-X", "-P", "-n", "--noconvert", "-S", start, "-E", "now",
            "-o", ",".join(FIELDS), *(["-a"] if everyone else [])]


def _time(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None   # Unknown (not started, or still running), None


def _gpus(tres: str) -> int:
    """The GPUs of an allocation's AllocTRES ("cpu=2,gres/gpu=2,mem=1G,node=1")."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu" and value.isdigit():
            return int(value)
    return 0


def parse(out: str, since: float, now: float) -> dict[str, dict[str, Any]]:
    """{user: {"jobs", "node_hours", "gpu_hours"}}: each allocation's time inside the
    window [SINCE, NOW], times its nodes and its GPUs."""
    users: dict[str, dict[str, Any]] = {}
    for line in out.splitlines():
        cells = line.split("|")
        if len(cells) != len(FIELDS):
            continue
        _, user, nnodes, tres, start, end = cells
        began = _time(start)
        if began is None or not nnodes.isdigit():
            continue
        ended = _time(end)
        seconds = max(0.0, min(ended if ended is not None else now, now) - max(began, since))
        t = users.setdefault(user, {"jobs": 0, "node_hours": 0.0, "gpu_hours": 0.0})
        t["jobs"] += 1
        t["node_hours"] += seconds * int(nnodes) / HOUR
        t["gpu_hours"] += seconds * _gpus(tres) / HOUR
    return {u: {**t, "node_hours": round(t["node_hours"], 3),
                "gpu_hours": round(t["gpu_hours"], 3)} for u, t in sorted(users.items())}


def slurm_usage(since: float, now: float) -> dict[str, Any]:
    """{"users": parse(...), "error": None} from this node's sacct (every user's as root),
    or {"users": {}, "error": why}."""
    try:
        done = subprocess.run(command(since, os.geteuid() == 0), capture_output=True,
                              text=True, timeout=TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"users": {}, "error": f"sacct: {exc}"}
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return {"users": {}, "error": f"sacct: {said}"}
    return {"users": parse(done.stdout, since, now), "error": None}
