"""What the soak reads of Slurm on the controller node: the GPUs each running job holds
(their indices, which only `scontrol -d show job` gives, while the job runs) and each
allocation's start and end from its accounting (sacct). Shell and parsers; tested without
a cluster."""

from __future__ import annotations

import re
from datetime import datetime

# Slurm's running jobs with the GPU indices each holds on each node.
RUNNING_GPUS = ("for j in $(squeue -h -t R -o %A 2>/dev/null); do echo \"JOB $j\"; "
              "scontrol -d show job $j | grep -o 'Nodes=[^ ]* CPU_IDs=[^ ]* Mem=[^ ]* "
              "GRES=[^ ]*'; done; true")
_NODES_GRES = re.compile(r"Nodes=(?P<nodes>\S+) .*GRES=\S*?\(IDX:(?P<idx>[0-9,-]+)\)")


def parse_running_gpus(text: str) -> list[tuple[str, str, set[int]]]:
    """RUNNING_GPUS's output as (job, node, GPU indices)."""
    found = []
    job = ""
    for line in text.splitlines():
        if line.startswith("JOB "):
            job = line.split()[1]
            continue
        m = _NODES_GRES.search(line)
        if job and m:
            idx = expand_numbers(m.group("idx"))
            found += [(job, node, idx) for node in expand_hosts(m.group("nodes"))]
    return found


def expand_numbers(text: str) -> set[int]:
    """"0-1,3" as {0, 1, 3}."""
    out: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def expand_hosts(text: str) -> list[str]:
    """Slurm's host list ("node[0-1,3],bastion") as names."""
    out = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", text):
        prefix, ranges = m.group(1), m.group(2)
        if not ranges:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low)
            out += [f"{prefix}{i:0{width}d}" for i in range(int(low), int(high or low) + 1)]
    return out


def parse_sacct(text: str, t0: float) -> list[tuple[str, float, float | None]]:
    """sacct -P lines (JobID|User|NodeList|Start|End|AllocTRES) as (job, start, end) on the
    soak's clock; a job still running (End "Unknown") ends None."""
    found = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 6 or not parts[0].isdigit() or "gres/gpu" not in parts[5]:
            continue
        start, end = (_sacct_time(p, t0) for p in parts[3:5])
        if start is not None:
            found.append((parts[0], start, end))
    return found


def _sacct_time(text: str, t0: float) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp() - t0
    except ValueError:
        return None
