"""What Slurm says, in a user's words: why a job waits, who holds what it waits for,
which limit a request could never be within (the node side, node/allocate.py, asks; this
module reads and words it, and asks squeue for the queue, `queue` and `ui`'s nodes
page)."""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING, Any

from ..errors import ClusterError
from ..node.queuelimits import Limit, slurm_time
from . import ssh

if TYPE_CHECKING:
    from .inventory import Cluster

# Slurm's reasons for a waiting job (squeue %r), as a user reads them. The per-user GPU
# limit's is worded from what the job's user holds (per_user_words).
REASONS = {
    "Resources": "waiting for GPUs to free",
    "Priority": "behind jobs of higher priority (fair share: who used the cluster less "
                "goes first)",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "QOSMaxGRESPerJob": "more GPUs than one job may have (the site's per-job limit): it "
                        "can never start; cancel it and ask for fewer",
    "PartitionNodeLimit": "more nodes than the partition has or lets one job have: it can "
                          "never start; cancel it and ask for fewer",
    "PartitionTimeLimit": "a time limit above the partition's: it can never start; cancel "
                          "it and ask for less",
    "Dependency": "waiting for another job",
    "BeginTime": "not before its start time",
    "None": "just queued",
}
PER_USER = "QOSMaxGRESPerUser"
_GPUS = re.compile(r"gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")


def per_user_words(held: int, who: str) -> str:
    """Why a job waits at the per-user GPU limit, true to what its user holds: HELD GPUs
    in running jobs (squeue), WHO the user ('you', or their name)."""
    if held:
        return (f"over the site's per-user GPU limit with the {held} GPU(s) already held "
                f"by {who} in running jobs; it starts when enough of them end")
    return ("more GPUs than one user may hold (the site's per-user limit): it can never "
            "start; cancel it and ask for fewer")


def reason_words(reason: str, held: int = 0, who: str = "you") -> str:
    """Slurm's REASON in words; HELD: the GPUs the job's user WHO holds in running jobs."""
    if reason.startswith(PER_USER):
        return per_user_words(held, who)
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


def holder_gpus(holder: dict) -> int:
    """The GPUs one running job holds (per node, times its nodes)."""
    return gpus_of(holder.get("gres", "")) * int(holder.get("count") or 1)


def waiting_line(event: dict, waited: float) -> str:
    """One line for a waiting job, from node/allocate.py's 'pending' event (the user's
    own: at the per-user limit, only their running jobs are named as the holders)."""
    place = f"#{event['position']} in the queue, " if event.get("position") else ""
    holders = event.get("holders") or []
    reason = event.get("reason", "")
    own = [h for h in holders if h.get("user") == event.get("user")]
    if reason.startswith(PER_USER):
        holders = own
    held = holder_words(holders)
    return (f"queued as Slurm job {event.get('job')} for {waited:.0f} s: {place}"
            f"{reason_words(reason, sum(holder_gpus(h) for h in own))}"
            + (f"; held by {held}" if held else ""))


def _fewer_gpus(most: int, nodes: int, per_node: int) -> str:
    """Train's options for a request of at most MOST GPUs, near NODES x PER_NODE."""
    if per_node and most // per_node >= 1:
        return f"--nodes {most // per_node} --gpus-per-node {per_node}"
    return f"--nodes {nodes} --gpus-per-node {most // nodes}" if most >= nodes else \
        f"--nodes 1 --gpus-per-node {most}"


def breach_words(breach: dict, nodes: int, per_node: int) -> str:
    """One limit of node/queuelimits.py's a request is above, with what to ask instead."""
    limit, asked, most = Limit(breach["limit"]), breach["asked"], breach["most"]
    where = f"{breach['where']}, {breach['setting']}"
    if limit is Limit.GPUS_PER_USER:
        return (f"{asked} GPUs ({nodes} node(s) x {per_node}) is more than one user may "
                f"hold at once: {most} ({where}); ask for at most {most}, e.g. "
                f"{_fewer_gpus(most, nodes, per_node)}")
    if limit is Limit.GPUS_PER_JOB:
        return (f"{asked} GPUs ({nodes} node(s) x {per_node}) is more than one job may "
                f"have: {most} ({where}); ask for at most {most}, e.g. "
                f"{_fewer_gpus(most, nodes, per_node)}")
    if limit is Limit.NODES:
        return (f"{asked} nodes is more than the partition has: {most} ({where}); ask for "
                f"--nodes {most} or fewer")
    if limit is Limit.NODES_PER_JOB:
        return (f"{asked} nodes is more than one job may have: {most} ({where}); ask for "
                f"--nodes {most} or fewer")
    return (f"a time limit of {slurm_time(asked)} is above the partition's: "
            f"{slurm_time(most)} ({where}); ask for --time {slurm_time(most)} or less")


def limit_words(event: dict) -> str:
    """Why Slurm could never start a request, from node/allocate.py's 'over-limit' event."""
    nodes, per_node = int(event.get("nodes") or 1), int(event.get("gpus_per_node") or 0)
    return ("Slurm could never start this request, it would wait for ever: "
            + "; ".join(breach_words(b, nodes, per_node) for b in event["limits"])
            + " (or ask the cluster's admin to raise the limit). Nothing was queued")


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
    held: dict[str, int] = {}
    for j in running:
        held[j["user"]] = held.get(j["user"], 0) + j["gpus"]
    for place, j in enumerate(waiting, 1):
        rows.append((j["job"], j["user"], f"run {j['run']}" if j["run"] else j["name"],
                     f"waiting #{place}", str(j["gpus"]), f"{j['count']} node(s)",
                     reason_words(j["reason"], held.get(j["user"], 0), j["user"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True))
                     + "  " + r[-1] for r in rows)
