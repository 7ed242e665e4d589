"""`allocate`: hold a Slurm allocation for a run, as long as the controller's connection
lives (standard library only; runs on any node with Slurm's client).

    node.py allocate --name clustertrain-RUN --gpus-per-node all|G -- -N 2 [--partition=P ...]

A request above a limit that no end of other jobs can lift (queuelimits.py: the QOS's per-
user or per-job GPUs, the partition's nodes or MaxTime) is refused: one line {"event":
"over-limit", "nodes", "gpus_per_node", "limits"} says which, and the command ends with
exit 2. The partition's limits are checked before anything is submitted, the QOS's while
salloc submits (Slurm refuses a request above a DenyOnLimit QOS itself; a job waiting
above another QOS's limit is cancelled). Else `salloc --no-shell` asks for the allocation
(G GPUs per node; all: as many as the nodes with the fewest have). While it waits, a JSON
line is printed each time what Slurm says of the job changes: {"event": "pending", "job",
"user", "reason", "position", "holders"} (user: the job's; holders: the running jobs, with
their user, nodes and GPUs per node). Once granted: {"event": "granted", "job", "nodes",
"gpus"} (gpus: each node's GPU indices). Then it reads its standard input to the end,
which comes when the controller's `train` ends, however it ends (Ctrl-C, a closed
terminal, kill -9: the SSH connection closes), and cancels the job: nothing is left in the
queue. SIGHUP is ignored, so that a closing session cannot skip the cancel. The line KEEP
instead leaves the granted job to the run (a detached run: its supervisors cancel it when
it ends, node/slurmjob.py) and ends this command.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from . import queuelimits

POLL = 1.0   # seconds between two looks at a waiting job (the first after one)
TICK = 0.05  # seconds between two looks at salloc
_JOB_RE = re.compile(r"job allocation (\d+)")
_GRES_IDX = re.compile(r"gpu(?::[^(\s]*)?\(IDX:([0-9,-]*)\)")
KEEP = "keep"


def say(event: dict) -> None:
    print(json.dumps(event), flush=True)


def slurm(*argv: str, timeout: float = 30.0) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          check=False).stdout


def indices(text: str) -> list[int]:
    """'0-1,3' -> [0, 1, 3]."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def hostnames(expr: str) -> list[str]:
    return slurm("scontrol", "show", "hostnames", expr).split()


def gres_lines(detail: str) -> list[tuple[str, list[int]]]:
    """(node list, GPU indices) of each 'Nodes=... GRES=gpu:2(IDX:0-1)' line of
    `scontrol show job -d` (a node list there may name several nodes)."""
    out = []
    for line in detail.splitlines():
        line = line.strip()
        if line.startswith("Nodes="):
            found = _GRES_IDX.search(line)
            out.append((line.split()[0][len("Nodes="):],
                        indices(found.group(1)) if found else []))
    return out


def job_gpus(detail: str) -> dict[str, list[int]]:
    """Each node's GPU indices, from `scontrol show job -d`."""
    return {node: gpus for nodes, gpus in gres_lines(detail) if nodes
            for node in hostnames(nodes)}


def waiting(job: str) -> dict:
    """What Slurm says of a waiting job: its reason, its place among the waiting jobs (by
    priority) and who holds the nodes' GPUs now."""
    state = slurm("squeue", "-h", "-j", job, "-o", "%T|%r|%u").strip().split("|")
    order = slurm("squeue", "-h", "-t", "PD", "--sort=-p,i", "-o", "%i").split()
    holders = []
    fields = ("job", "user", "name", "nodes", "gres", "time", "count")
    for line in slurm("squeue", "-h", "-t", "R", "-o", "%i|%u|%j|%N|%b|%M|%D").splitlines():
        parts = line.split("|")
        if len(parts) == len(fields) and parts[0] != job:
            holders.append(dict(zip(fields, parts, strict=True)))
    return {"event": "pending", "job": job, "state": state[0] if state else "",
            "reason": state[1] if len(state) > 1 else "",
            "user": state[2] if len(state) > 2 else "",
            "position": order.index(job) + 1 if job in order else 0, "holders": holders}


def gres(gpus_per_node: str) -> list[str]:
    """salloc's --gres for G GPUs per node, or for 'all': the fewest any node has."""
    if gpus_per_node != "all":
        return [f"--gres=gpu:{int(gpus_per_node)}"] if int(gpus_per_node) > 0 else []
    counts = []
    try:
        listed = slurm("sinfo", "-h", "-N", "-o", "%G")
    except FileNotFoundError:
        listed = ""
    for line in listed.splitlines():
        found = re.search(r"gpu(?::[^:(,]+)?:(\d+)", line)
        counts.append(int(found.group(1)) if found else 0)
    fewest = min(counts) if counts else 0
    return [f"--gres=gpu:{fewest}"] if fewest else []


def over_limit(ask: queuelimits.Ask, over: list[queuelimits.Breach]) -> int:
    """Say which limits ASK is above (the 'over-limit' event); allocate's exit code."""
    say({"event": "over-limit", "job": "", "nodes": ask.nodes,
         "gpus_per_node": ask.gpus_per_node, "limits": [b.to_json() for b in over]})
    return 2


def watch_input() -> tuple[threading.Event, threading.Event]:
    """(ended, kept): set when the standard input ends (the controller's `train` is gone),
    and when it said KEEP (ended then too)."""
    ended, kept = threading.Event(), threading.Event()

    def watch() -> None:
        try:
            for line in sys.stdin:
                if line.strip() == KEEP:
                    kept.set()
                    return
        finally:
            ended.set()

    threading.Thread(target=watch, daemon=True).start()
    return ended, kept


class Salloc:
    """salloc started with ARGV, its output read as it comes: the job's id once Slurm
    has given one, and every line it said."""

    def __init__(self, argv: list[str]) -> None:
        self.job, self.lines = "", list[str]()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            found = _JOB_RE.search(line)
            if found:
                self.job = found.group(1)


def main(name: str, gpus_per_node: str, salloc_args: list[str]) -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    ended, kept = watch_input()
    asked = gres(gpus_per_node)
    ask = queuelimits.Ask.from_salloc(salloc_args, asked)
    part = queuelimits.partition(ask)
    over = queuelimits.breaches(ask, part, {})
    if over:   # it would wait for ever: refused before anything is queued
        return over_limit(ask, over)
    # The QOS's limits, from Slurm's accounting (a third of a second away), are read
    # beside salloc: Slurm refuses a request above a QOS with DenyOnLimit (the role's)
    # itself, and a job that waits above another QOS's is cancelled once that is known.
    qos_over: list[queuelimits.Breach] = []
    qos_read = threading.Thread(target=lambda: qos_over.extend(
        queuelimits.breaches(ask, part, queuelimits.qos_of(ask, part))), daemon=True)
    qos_read.start()
    try:
        salloc = Salloc(["salloc", "--no-shell", f"--job-name={name}", *asked, *salloc_args])
    except FileNotFoundError:
        say({"event": "refused", "job": "", "exit": 127, "said": [
            "this node has no Slurm client (salloc); provision Slurm with site.yml and "
            "cluster_scheduler: slurm"]})
        return 127
    proc, granted = salloc.proc, False
    last = None
    next_look = time.monotonic() + POLL
    try:
        while proc.poll() is None:
            if ended.wait(TICK):
                return 130   # the controller went away while waiting: cancel (finally)
            if qos_over:     # it would wait for ever: cancelled (finally)
                return over_limit(ask, qos_over)
            if salloc.job and time.monotonic() >= next_look:
                next_look = time.monotonic() + POLL
                now = waiting(salloc.job)
                key = (now["reason"], now["position"], [h["job"] for h in now["holders"]])
                if now["state"] == "PENDING" and key != last:
                    say(now)
                    last = key
        salloc.reader.join(timeout=5)
        job = salloc.job
        if proc.returncode != 0 or not job:
            qos_read.join(timeout=60)
            if qos_over:     # Slurm's refusal (DenyOnLimit), said with the limit's name
                return over_limit(ask, qos_over)
            said = [line for line in salloc.lines if line]
            say({"event": "refused", "job": job, "said": said[-5:],
                 "exit": proc.returncode})
            return proc.returncode or 1
        detail = slurm("scontrol", "show", "job", "-d", job)
        nodes = re.search(r"\bNodeList=(\S+)", detail)
        say({"event": "granted", "job": job,
             "nodes": hostnames(nodes.group(1)) if nodes else [], "gpus": job_gpus(detail),
             "at": time.time()})
        granted = True
        ended.wait()
        return 0
    finally:
        if proc.poll() is None:
            proc.terminate()
        if not (granted and kept.is_set()):   # KEEP: the run's supervisors cancel it
            user = os.environ.get("USER") or str(os.getuid())
            if salloc.job:
                slurm("scancel", salloc.job)
            slurm("scancel", f"--name={name}", f"--user={user}")
