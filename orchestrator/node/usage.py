"""Who used the cluster, and how much (`node.py usage`, the node side of `clustertrain
usage`): node-hours and GPU-hours per user and per run, from the runs' records on the
share (checkpoints/USER/.clustertrain/runs/RUN/NODE.json, each node's part as its
supervisor wrote it: its user, when it started and ended, the GPUs it used, and the
GPU-seconds those GPUs did nothing: sysmetrics.IdleGpus).

A part still running counts until its state's last writing (its supervisor rewrites it
every few seconds). Only the time inside the window counts (SINCE to now). As for `du`,
a user reads the records the share's modes let them (their own); an admin reads
everyone's as root (`usage --all`, through sudo).
"""

from __future__ import annotations

import glob
import os
import time
from typing import Any

from .protocol import NODE_STATE_DIR
from .sysmetrics import visible_gpus
from .util import owner_of, read_json

HOUR = 3600.0
IDLE_HOURS = 1.0   # a run (or notebook) whose GPUs sat idle this many GPU-hours is listed


def gpus_used(argv: list[str], environ: dict[str, str] | os._Environ[str] = os.environ,
              devices: int | None = None) -> int:
    """The GPUs a node's part of a run uses: those CUDA_VISIBLE_DEVICES shows it (Slurm's
    choice, read as the sampler reads it: sysmetrics.visible_gpus; named by UUID, each
    name), else as many of the node's GPUs (DEVICES, /dev/nvidiaN by default) as torchrun
    starts processes (--nproc-per-node N; `gpu` or `auto`: all of them)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        given = visible_gpus(environ)
        return len(given) if given is not None else len([d for d in visible.split(",")
                                                         if d.strip()])
    if devices is None:
        devices = len(glob.glob("/dev/nvidia[0-9]*"))
    if not devices:
        return 0
    nproc = next((argv[i + 1] for i, a in enumerate(argv[:-1])
                  if a in ("--nproc-per-node", "--nproc_per_node")), None)
    nproc = nproc or next((a.split("=", 1)[1] for a in argv
                           if a.startswith(("--nproc-per-node=", "--nproc_per_node="))), None)
    return min(devices, int(nproc)) if nproc and nproc.isdigit() else devices


def part(state: dict[str, Any], since: float, now: float
         ) -> tuple[float, float, float] | None:
    """Seconds of one node's part inside [SINCE, NOW], its GPU-seconds, and those of its
    GPU-seconds that were idle (the supervisor's count over the whole part, its share
    inside the window); None for a state that says no start."""
    started = state.get("started")
    if not isinstance(started, (int, float)):
        return None
    end = next((t for t in (state.get("ended"), state.get("time"))
                if isinstance(t, (int, float))), started)
    seconds = max(0.0, min(float(end), now) - max(float(started), since))
    gpus = state.get("gpus")
    gpu_seconds = seconds * (gpus if isinstance(gpus, int) and gpus > 0 else 0)
    idle = state.get("gpu_idle_s")
    whole = float(end) - float(started)
    idle_seconds = min(gpu_seconds, float(idle) * seconds / whole) \
        if isinstance(idle, (int, float)) and idle > 0 and whole > 0 else 0.0
    return seconds, gpu_seconds, idle_seconds


def usage(share: str, since: float = 0.0, now: float | None = None) -> dict[str, Any]:
    """{"since", "runs": [{"run", "user", "nodes", "start", "end", "node_hours",
    "gpu_hours", "idle_gpu_hours"}], "users": {user: {"runs", "node_hours", "gpu_hours",
    "idle_gpu_hours"}}, "idle": [the runs with IDLE_HOURS idle GPU-hours or more],
    "unread": [{"path", "owner", "why"}]}: the records of every user this process may
    read."""
    now = time.time() if now is None else now
    runs: list[dict[str, Any]] = []
    unread: list[dict[str, str]] = []
    top = os.path.join(share, "checkpoints")
    try:
        users = sorted(os.listdir(top))
    except OSError as exc:
        return {"since": since, "runs": [], "users": {}, "unread": [
            {"path": top, "owner": "?", "why": exc.strerror or str(exc)}]}
    for user in users:
        records = os.path.join(top, user, NODE_STATE_DIR, "runs")
        try:
            ids = sorted(os.listdir(records))
        except FileNotFoundError:
            continue
        except OSError as exc:
            mine = os.path.join(top, user)
            unread.append({"path": mine, "owner": owner_of(mine),
                           "why": exc.strerror or str(exc)})
            continue
        for run_id in ids:
            found = _run(os.path.join(records, run_id), run_id, user, since, now)
            if found is not None:
                runs.append(found)
    totals: dict[str, dict[str, Any]] = {}
    hours = ("node_hours", "gpu_hours", "idle_gpu_hours")
    for r in runs:
        t = totals.setdefault(r["user"], {"runs": 0, **dict.fromkeys(hours, 0.0)})
        t["runs"] += 1
        for key in hours:
            t[key] += r[key]
    return {"since": since, "runs": runs,
            "users": {u: {**t, **{k: round(t[k], 3) for k in hours}}
                      for u, t in sorted(totals.items())},
            "idle": [r for r in runs if r["idle_gpu_hours"] >= IDLE_HOURS],
            "unread": unread}


def _run(path: str, run_id: str, user: str, since: float,
         now: float) -> dict[str, Any] | None:
    """One run's use inside the window, from its nodes' state files; None if none of its
    time falls inside it."""
    nodes, seconds, gpu_seconds, idle_seconds = [], 0.0, 0.0, 0.0
    starts, ends = [], []
    for file in sorted(glob.glob(os.path.join(path, "*.json"))):
        state = read_json(file)
        if not isinstance(state, dict) or "node" not in state:
            continue   # not a node's state (a recovery plan, a decision)
        counted = part(state, since, now)
        if counted is None:
            continue
        nodes.append(str(state["node"]))
        seconds += counted[0]
        gpu_seconds += counted[1]
        idle_seconds += counted[2]
        starts.append(float(state["started"]))
        ends.append(state.get("ended"))
    if not nodes or seconds <= 0:
        return None
    ended = [float(e) for e in ends if isinstance(e, (int, float))]
    return {"run": run_id, "user": user, "nodes": nodes, "start": min(starts),
            "end": max(ended) if len(ended) == len(ends) else None,
            "node_hours": round(seconds / HOUR, 4), "gpu_hours": round(gpu_seconds / HOUR, 4),
            "idle_gpu_hours": round(idle_seconds / HOUR, 4)}

