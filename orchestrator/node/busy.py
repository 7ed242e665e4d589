"""Who else uses this node now (`node.py busy`, and part of preflight's probe): the live
runs of every user, found by their supervisors' processes, and the processes on its GPUs
(nvidia-smi), each with its owner and the Slurm job it is a step of, if any (a queued run's
preflight leaves those to Slurm, which gave them other GPUs). Everything is read from /proc
as it is now, never from a run's state files: a stale file cannot make a node look busy,
nor a live run look gone. What it finds is the verb's answer (answers.py: Busy, LiveRun,
GpuProcess).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess

from .answers import Busy, GpuProcess, LiveRun
from .health import supervised_run
from .protocol import NOTEBOOK_MODULE
from .util import process_table

SMI_TIMEOUT = 30.0   # seconds for one nvidia-smi query (a busy driver answers slowly)
QUERY_APPS = ["--query-compute-apps=pid,gpu_uuid,used_memory",
              "--format=csv,noheader,nounits"]
QUERY_GPUS = ["--query-gpu=index,uuid", "--format=csv,noheader"]
COMMAND_CHARS = 80   # of a bare GPU process's command line, in the report
# slurmstepd's process title for a step of job JOB ([JOB.0], [JOB.batch], [JOB.extern]):
# every task Slurm starts is its child, under any proctrack plugin.
_STEPD = re.compile(r"slurmstepd: \[(\d+)[.\]]")
# A Slurm job's cgroup (proctrack/cgroup, v1 and v2): a process that left its stepd's tree.
_JOB_CGROUP = re.compile(r"/job_(\d+)/")
ANCESTORS = 64       # parents looked through for a run's supervisor or a slurmstepd


# --- nvidia-smi's answers ---------------------------------------------------------------------

def parse_gpus(text: str) -> dict[str, int]:
    """`nvidia-smi --query-gpu=index,uuid --format=csv,noheader`: uuid -> index."""
    found = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            found[parts[1]] = int(parts[0])
    return found


def parse_apps(text: str, gpus: dict[str, int]) -> list[GpuProcess]:
    """`nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory
    --format=csv,noheader,nounits`, one row per process and GPU; other lines (nvidia-smi's
    "No running processes found") are not rows."""
    found = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        pid, uuid, used = parts
        found.append(GpuProcess(int(pid), uuid, gpus.get(uuid),
                                int(used) if used.isdigit() else None))
    return found


def _smi(exe: str, args: list[str]) -> str:
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT)
    if p.returncode != 0:
        said = (p.stderr.strip() or p.stdout.strip()).splitlines() or [f"exit {p.returncode}"]
        raise RuntimeError(f"nvidia-smi {args[0]}: {said[-1]}")
    return p.stdout


def gpu_processes(smi: str = "nvidia-smi") -> tuple[list[GpuProcess], str | None]:
    """Every process on this node's GPUs, and why they could not be read (None: they
    were). No nvidia-smi: a node without NVIDIA GPUs, so none."""
    exe = shutil.which(smi)
    if exe is None:
        return [], None
    try:
        return parse_apps(_smi(exe, QUERY_APPS), parse_gpus(_smi(exe, QUERY_GPUS))), None
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return [], str(exc)


# --- the processes ----------------------------------------------------------------------------

def kind_of(argv: list[str]) -> str:
    """What a supervisor's run is, from the command it starts (after its `--`): a
    notebook when that runs NOTEBOOK_MODULE, else a run."""
    started = argv[argv.index("--") + 1:] if "--" in argv else []
    return "notebook" if NOTEBOOK_MODULE in started else "run"


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return []
    return [w.decode(errors="replace") for w in raw.split(b"\0")[:-1]]


def _owner(pid: int) -> str | None:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _lineage(pid: int, parents: dict[int, int]) -> list[int]:
    """PID and its ancestors, nearest first (ANCESTORS at most)."""
    found = [pid]
    while len(found) < ANCESTORS and pid in parents and parents[pid] not in (pid, 0):
        pid = parents[pid]
        found.append(pid)
    return found


def _run_of(pid: int, supervisors: dict[int, str], parents: dict[int, int]) -> str | None:
    """The run whose supervisor PID is an ancestor of (or is) PID."""
    return next((supervisors[p] for p in _lineage(pid, parents) if p in supervisors), None)


def stepd_job(title: str) -> str | None:
    """The job of a slurmstepd, from its process TITLE (its /proc/PID/cmdline, NULs as
    spaces), else None."""
    found = _STEPD.match(title)
    return found.group(1) if found else None


def _title(pid: int) -> str:
    """Process PID's command line as one line: a process title written over argv (as
    slurmstepd's) may end without the NUL _cmdline expects."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def cgroup_job(text: str) -> str | None:
    """The Slurm job of a process whose /proc/PID/cgroup is TEXT, else None."""
    found = _JOB_CGROUP.search(text)
    return found.group(1) if found else None


def _cgroup(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            return fh.read()
    except OSError:
        return ""


def slurm_job_of(pid: int, parents: dict[int, int]) -> str | None:
    """The Slurm job process PID is part of: the job of a slurmstepd among its ancestors
    (a task Slurm started, and what it started), else of its cgroup. None: a process
    started outside Slurm, or one whose ancestors cannot be seen (hidepid)."""
    for p in _lineage(pid, parents)[1:]:
        job = stepd_job(_title(p))
        if job is not None:
            return job
    return cgroup_job(_cgroup(pid))


def scan(exclude: str | None = None, smi: str = "nvidia-smi") -> Busy:
    """This node's runs (any user's, but EXCLUDE's: the run being launched) and the GPU
    processes of no run; a GPU process of a run counts for its run."""
    table = process_table()
    supervisors: dict[int, str] = {}
    runs: dict[tuple[str, str], LiveRun] = {}
    for pid in table:
        argv = _cmdline(pid)
        run = supervised_run(argv)
        user = _owner(pid) if run else None
        if run and user:
            supervisors[pid] = run
            if run != exclude:
                runs.setdefault((user, run), LiveRun(run, user, kind=kind_of(argv))
                                ).pids.append(pid)
    parents = {pid: proc.ppid for pid, proc in table.items()}
    for r in runs.values():
        r.slurm_job = next(filter(None, (slurm_job_of(p, parents) for p in r.pids)), None)
    by_run = {r.run: r for r in runs.values()}
    used, error = gpu_processes(smi)
    bare: list[GpuProcess] = []
    for g in used:
        run = _run_of(g.pid, supervisors, parents)
        if run is None:
            g.user = _owner(g.pid)
            g.command = " ".join(_cmdline(g.pid))[:COMMAND_CHARS]
            g.slurm_job = slurm_job_of(g.pid, parents)
            bare.append(g)
        elif run in by_run and g.gpu is not None and g.gpu not in by_run[run].gpus:
            by_run[run].gpus.append(g.gpu)
    for r in runs.values():
        r.gpus.sort()
    return Busy(sorted(runs.values(), key=lambda r: (r.user, r.run)), bare,
                hidden=not os.access("/proc/1/cmdline", os.R_OK), error=error)
