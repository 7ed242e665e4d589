"""What Slurm says, in a user's words: why a job waits, who holds what it waits for
(the node side, node/allocate.py, asks; this module reads and words it, and asks
squeue for the queue, `queue` and `ui`'s nodes page)."""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING, Any

from ..errors import ClusterError
from . import ssh

if TYPE_CHECKING:
    from .inventory import Cluster

# Slurm's reasons for a waiting job (squeue %r), as a user reads them.
REASONS = {
    "Resources": "waiting for GPUs to free",
    "Priority": "behind jobs of higher priority (fair share: who used the cluster less "
                "goes first)",
    "QOSMaxGRESPerUser": "you already hold the most GPUs one user may (the site's "
                         "per-user limit); it starts when one of your jobs ends",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "PartitionNodeLimit": "more nodes than the partition has",
    "Dependency": "waiting for another job",
    "BeginTime": "not before its start time",
    "None": "just queued",
}
_GPUS = re.compile(r"gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")


def reason_words(reason: str) -> str:
    for key, words in REASONS.items():
        if reason.startswith(key):
            return words
    return reason or "queued"


def gpus_of(gres: str) -> int:
    """GPUs per node of squeue's %b ('gres:gpu:2', 'gres/gpu:2', 'N/A')."""
    found = _GPUS.search(gres or "")
    return int(found.group(1)) if found else 0


def holder_words(holders: list[dict]) -> str:
    """'alice's run 20261126-1 (job 12, node[0-1], 2 GPUs per node, 0:42)'..."""
    parts = []
    for h in holders:
        name = h.get("name", "")
        what = (f"run {name[len('clustertrain-'):]}" if name.startswith("clustertrain-")
                else f"job {name}" if name else "a job")
        gpus = gpus_of(h.get("gres", ""))
        parts.append(f"{h.get('user', '?')}'s {what} (job {h.get('job', '?')}, "
                     f"{h.get('nodes', '?')}" + (f", {gpus} GPUs per node" if gpus else "")
                     + f", for {h.get('time', '?')})")
    return "; ".join(parts)


def waiting_line(event: dict, waited: float) -> str:
    """One line for a waiting job, from node/allocate.py's 'pending' event."""
    place = f"#{event['position']} in the queue, " if event.get("position") else ""
    held = holder_words(event.get("holders") or [])
    return (f"queued as Slurm job {event.get('job')} for {waited:.0f} s: {place}"
            f"{reason_words(event.get('reason', ''))}"
            + (f"; held by {held}" if held else ""))


# squeue's fields for `queue`, in this order (%b: GPUs per node as 'gres:gpu:N').
SQUEUE_FORMAT = "%i|%u|%j|%T|%r|%N|%b|%D|%M|%Q"
_FIELDS = ("job", "user", "name", "state", "reason", "nodes", "gres", "count", "time",
           "priority")


def parse_squeue(text: str) -> list[dict]:
    """`squeue -h -o SQUEUE_FORMAT` as one dict per job (ours named by their run)."""
    jobs = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(_FIELDS):
            continue
        job: dict[str, Any] = dict(zip(_FIELDS, parts, strict=True))
        job["gpus"] = gpus_of(job["gres"]) * int(job["count"] or 0)
        job["run"] = (job["name"][len("clustertrain-"):]
                      if job["name"].startswith("clustertrain-") else None)
        jobs.append(job)
    return jobs


def squeue(cluster: Cluster) -> list[dict]:
    """Every user's jobs in Slurm's queue, asked through the cluster's first node."""
    first = cluster.nodes[0]
    conn = ssh.connect(first.name, first.ssh)
    try:
        result = conn.run(shlex.join(["squeue", "-h", "-o", SQUEUE_FORMAT]), timeout=30)
    finally:
        conn.close()
    if result.exit_code != 0:
        raise ClusterError(f"{first.name}: squeue failed: {result.stderr.strip()[-300:]}")
    return parse_squeue(result.stdout)


def render_queue(jobs: list[dict]) -> str:
    """`queue`'s table: running jobs first, then the waiting ones in the order Slurm
    would start them (by priority), each waiting one with its reason in words."""
    running = [j for j in jobs if j["state"] != "PENDING"]
    waiting = sorted((j for j in jobs if j["state"] == "PENDING"),
                     key=lambda j: (-int(j["priority"] or 0), int(j["job"])))
    if not jobs:
        return "the queue is empty: every GPU is free"
    rows = [("JOB", "USER", "WHAT", "STATE", "GPUS", "NODES", "FOR / WHY")]
    for j in running:
        rows.append((j["job"], j["user"], f"run {j['run']}" if j["run"] else j["name"],
                     j["state"].lower(), str(j["gpus"]), j["nodes"], j["time"]))
    for place, j in enumerate(waiting, 1):
        rows.append((j["job"], j["user"], f"run {j['run']}" if j["run"] else j["name"],
                     f"waiting #{place}", str(j["gpus"]), f"{j['count']} node(s)",
                     reason_words(j["reason"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True))
                     + "  " + r[-1] for r in rows)
