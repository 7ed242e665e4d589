"""`allocate`: hold a Slurm allocation for a run, as long as the controller's connection
lives (standard library only; runs on any node with Slurm's client).

    node.py allocate --name clustertrain-RUN --gpus-per-node all|G -- -N 2 [--partition=P ...]

A request above a limit that no end of other jobs can lift (queuelimits.py: the QOS's per-
user or per-job GPUs, the partition's nodes or MaxTime) is refused: one line {"event":
"over-limit", "nodes", "gpus_per_node", "limits"} says which, and the command ends with
exit 2. The partition's limits are checked before anything is submitted, the QOS's while
salloc submits (Slurm refuses a request above a DenyOnLimit QOS itself; a job waiting
above another QOS's limit is cancelled). Else a batch job asks for the allocation (G GPUs
per node; all: as many as the nodes with the fewest have), its script (HOLD) holding it
and doing nothing else: the run's steps come beside it (srun --overlap). While it waits, a JSON
line is printed each time what Slurm says of the job changes: {"event": "pending", "job",
"user", "reason", "position", "holders"} (user: the job's; holders: the running jobs, with
their user, nodes and GPUs per node). Once granted: {"event": "granted", "job", "nodes",
"gpus"} (gpus: each node's GPU indices). Then it reads its standard input to the end,
which comes when the controller's `train` ends, however it ends (Ctrl-C, a closed
terminal, kill -9: the SSH connection closes), and cancels the job: nothing is left in the
queue. SIGHUP is ignored, so that a closing session cannot skip the cancel. A line
`END C` before the end says how the run ended (C 0: it succeeded): the job then ends as
the run did, COMPLETED or FAILED in Slurm's accounting, not CANCELLED (end_job). The line
KEEP instead leaves the granted job to the run (a detached run: its supervisors end it
when it ends, node/slurmjob.py) and ends this command.
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
from .slurmjob import end_job, job_state

POLL = 1.0   # seconds between two looks at a waiting job's reason and place
TICK = 0.25  # seconds between two looks at whether the job was granted
SUBMIT_WAIT = 60.0   # seconds sbatch may take to answer
_GRES_IDX = re.compile(r"gpu(?::[^(\s]*)?\(IDX:([0-9,-]*)\)")
KEEP = "keep"
END = "end"
# The batch job's script: it holds the allocation until it is told how the run ended
# (slurmjob.end_job: USR1 succeeded, USR2 failed) or the job is cancelled. A trap runs as
# soon as the signal comes while the shell waits on its sleep.
HOLD = ("trap 'exit 0' USR1; trap 'exit 1' USR2; "
        "while :; do sleep 5 & wait $!; done")


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


class Input:
    """What the controller's `train` says on the standard input, read in a thread: KEEP
    (a detached run: leave the job to it), END C (the run ended, C 0 if it succeeded), and
    when the input ends (`train` is gone, however it went); `ended` is set then."""

    def __init__(self) -> None:
        self.ended, self.kept = threading.Event(), threading.Event()
        self.code: int | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in sys.stdin:
                word, _, code = line.strip().partition(" ")
                if word == KEEP:
                    self.kept.set()
                    return
                if word == END and code.lstrip("-").isdigit():
                    self.code = int(code)
        finally:
            self.ended.set()


def submit(name: str, asked: list[str], args: list[str]) -> tuple[str, list[str], int]:
    """(the job's id, what sbatch said, its exit status): the holding batch job submitted
    (HOLD), which Slurm starts on the first of its nodes once it grants them."""
    try:
        proc = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", "--chdir=/",
                               "--output=/dev/null", "--error=/dev/null", f"--wrap={HOLD}",
                               *asked, *args], capture_output=True, text=True,
                              timeout=SUBMIT_WAIT, check=False)
    except subprocess.TimeoutExpired:
        return "", [f"sbatch did not answer in {SUBMIT_WAIT:.0f} s (slurmctld down?)"], 1
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    first = proc.stdout.strip().split(";")[0] if proc.returncode == 0 else ""
    return (first if first.isdigit() else ""), said, proc.returncode


def cancel(job: str, name: str) -> None:
    """Cancel JOB, and any job of this user's named NAME (a submission whose answer was
    lost): nothing of the run is left in the queue."""
    user = os.environ.get("USER") or str(os.getuid())
    try:
        if job:
            slurm("scancel", job)
        slurm("scancel", f"--name={name}", f"--user={user}")
    except (OSError, subprocess.TimeoutExpired):
        pass   # no Slurm client here: nothing was queued


def main(name: str, gpus_per_node: str, salloc_args: list[str]) -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    given = Input()
    asked = gres(gpus_per_node)
    ask = queuelimits.Ask.from_salloc(salloc_args, asked)
    part = queuelimits.partition(ask)
    over = queuelimits.breaches(ask, part, {})
    if over:   # it would wait for ever: refused before anything is queued
        return over_limit(ask, over)
    # The QOS's limits, from Slurm's accounting (a third of a second away), are read
    # beside the submission: Slurm refuses a request above a QOS with DenyOnLimit (the
    # role's) itself, and a job that waits above another QOS's is cancelled once known.
    qos_over: list[queuelimits.Breach] = []
    qos_read = threading.Thread(target=lambda: qos_over.extend(
        queuelimits.breaches(ask, part, queuelimits.qos_of(ask, part))), daemon=True)
    qos_read.start()
    job, granted = "", False
    try:
        try:
            job, said, code = submit(name, asked, salloc_args)
        except FileNotFoundError:
            say({"event": "refused", "job": "", "exit": 127, "said": [
                "this node has no Slurm client (sbatch); provision Slurm with site.yml and "
                "cluster_scheduler: slurm"]})
            return 127
        if not job:
            qos_read.join(timeout=60)
            if qos_over:     # Slurm's refusal (DenyOnLimit), said with the limit's name
                return over_limit(ask, qos_over)
            say({"event": "refused", "job": "", "said": said[-5:], "exit": code})
            return code or 1
        last = None
        next_look = time.monotonic() + POLL
        while True:
            if given.ended.wait(TICK):
                return 130   # the controller went away while waiting: cancel (finally)
            if qos_over:     # it would wait for ever: cancelled (finally)
                return over_limit(ask, qos_over)
            state = job_state(job)
            if state in ("RUNNING", "CONFIGURING"):
                break
            if state is not None and state not in ("PENDING", "REQUEUED", "RESIZING",
                                                   "SUSPENDED"):
                say({"event": "refused", "job": job, "exit": 1, "said": [
                    f"Slurm ended job {job} before it was granted"
                    + (f" ({state})" if state else "")]})
                return 1
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + POLL
                now = waiting(job)
                key = (now["reason"], now["position"], [h["job"] for h in now["holders"]])
                if now["state"] == "PENDING" and key != last:
                    say(now)
                    last = key
        detail = slurm("scontrol", "show", "job", "-d", job)
        nodes = re.search(r"\bNodeList=(\S+)", detail)
        say({"event": "granted", "job": job,
             "nodes": hostnames(nodes.group(1)) if nodes else [], "gpus": job_gpus(detail),
             "at": time.time()})
        granted = True
        given.ended.wait()
        return 0
    finally:
        if granted and given.kept.is_set():
            pass   # KEEP: the run's supervisors end it (slurmjob.py)
        elif not (granted and end_job(job, given.code)):
            cancel(job, name)
