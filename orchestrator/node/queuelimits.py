"""The limits of Slurm that a request can never be within, read before it is submitted
(node/allocate.py asks, on the cluster's first node; standard library only).

A request above one of them would wait in the queue for ever (Slurm keeps it pending as
QOSMaxGRESPerUser, PartitionNodeLimit, PartitionTimeLimit...), so it is refused before
salloc: more GPUs than one job or one user may hold (the QOS's MaxTRESPerJob and
MaxTRESPerUser gres/gpu), more nodes than the partition has or lets one job have
(TotalNodes, MaxNodes), a time above the partition's MaxTime.

The QOS read are the partition's and the one the request names (--qos); of the two, the
partition's limit counts unless the named QOS has the OverPartQOS flag (Slurm's order). A
request without --qos gets its association's default QOS from Slurm, which is not read
here: a limit set only there is left to Slurm (the role's QOS has DenyOnLimit, so Slurm
refuses such a request itself).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import asdict, dataclass
from enum import Enum

_GPU_TRES = re.compile(r"(?:^|,)gres/gpu=(\d+)(?:,|$)")
_GRES = re.compile(r"--gres=gpu:(\d+)")
UNLIMITED = ("UNLIMITED", "INFINITE", "NONE", "N/A", "")


class Limit(str, Enum):
    GPUS_PER_USER = "gpus-per-user"     # QOS MaxTRESPerUser gres/gpu
    GPUS_PER_JOB = "gpus-per-job"       # QOS MaxTRESPerJob gres/gpu
    NODES = "nodes"                     # the partition's TotalNodes
    NODES_PER_JOB = "nodes-per-job"     # the partition's MaxNodes
    TIME = "time"                       # the partition's MaxTime


@dataclass(frozen=True)
class Ask:
    """What one allocation asks for."""

    nodes: int
    gpus_per_node: int
    partition: str | None = None
    time_s: int | None = None
    qos: str | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @classmethod
    def from_salloc(cls, salloc_args: list[str], gres_args: list[str]) -> Ask:
        """The ask of allocate's salloc options (-N N [-w H] [--partition=P] [--time=T]
        [--qos=Q], run/allocation.py's AllocationRequest) and its --gres=gpu:G."""
        nodes, options = 1, dict[str, str]()
        args = iter(salloc_args)
        for arg in args:
            if arg == "-N":
                nodes = int(next(args))
            elif arg.startswith("--") and "=" in arg:
                key, _, value = arg[2:].partition("=")
                options[key] = value
        found = [_GRES.fullmatch(a) for a in gres_args]
        gpus = next((int(m.group(1)) for m in found if m), 0)
        time = options.get("time")
        return cls(nodes, gpus, options.get("partition"),
                   seconds(time) if time else None, options.get("qos"))


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    total_nodes: int
    max_nodes: int | None      # None: unlimited
    max_time_s: int | None
    qos: str | None


@dataclass(frozen=True)
class Qos:
    name: str
    gpus_per_job: int | None   # None: no limit
    gpus_per_user: int | None
    over_part_qos: bool


@dataclass(frozen=True)
class Breach:
    """One limit the ask is above: asked and most in the limit's unit (GPUs, nodes,
    seconds), where it is set and the setting as Slurm shows it."""

    limit: Limit
    asked: int
    most: int
    where: str
    setting: str

    def to_json(self) -> dict:
        return {**asdict(self), "limit": self.limit.value}


def seconds(text: str) -> int | None:
    """A Slurm time ('M', 'M:S', 'H:M:S', 'D-H', 'D-H:M', 'D-H:M:S') in seconds; None for
    UNLIMITED."""
    if text.upper() in UNLIMITED:
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
        return ((int(days) * 24 + h) * 60 + m) * 60 + s
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


def slurm_time(total: int) -> str:
    """Seconds as Slurm writes a time: D-HH:MM:SS, or H:MM:SS under a day."""
    days, rest = divmod(total, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{days}-{h:02d}:{m:02d}:{s:02d}" if days else f"{h}:{m:02d}:{s:02d}"


def _count(value: str) -> int | None:
    return None if value.upper() in UNLIMITED else int(value)


def partitions(text: str) -> list[Partition]:
    """`scontrol show partition -o`: one line per partition, KEY=VALUE fields."""
    out = []
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "PartitionName" not in fields:
            continue
        qos = fields.get("QoS", "N/A")
        out.append(Partition(fields["PartitionName"], fields.get("Default") == "YES",
                             int(fields.get("TotalNodes", "0")),
                             _count(fields.get("MaxNodes", "UNLIMITED")),
                             seconds(fields.get("MaxTime", "UNLIMITED")),
                             None if qos.upper() in UNLIMITED else qos))
    return out


def _gpus(tres: str) -> int | None:
    found = _GPU_TRES.search(tres)
    return int(found.group(1)) if found else None


def qoses(text: str) -> dict[str, Qos]:
    """`sacctmgr -nP show qos format=name,maxtres,maxtrespu,flags`."""
    out = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 4 or not parts[0]:
            continue
        out[parts[0]] = Qos(parts[0], _gpus(parts[1]), _gpus(parts[2]),
                            "OverPartQOS" in parts[3].split(","))
    return out


def breaches(ask: Ask, partition: Partition | None, qos: dict[str, Qos]) -> list[Breach]:
    """The limits ASK is above, alone: limits that no end of other jobs can lift."""
    found = []
    if partition is not None:
        where = f"partition {partition.name}"
        if ask.nodes > partition.total_nodes:
            found.append(Breach(Limit.NODES, ask.nodes, partition.total_nodes, where,
                                f"TotalNodes={partition.total_nodes}"))
        elif partition.max_nodes is not None and ask.nodes > partition.max_nodes:
            found.append(Breach(Limit.NODES_PER_JOB, ask.nodes, partition.max_nodes, where,
                                f"MaxNodes={partition.max_nodes}"))
        if (ask.time_s is not None and partition.max_time_s is not None
                and ask.time_s > partition.max_time_s):
            found.append(Breach(Limit.TIME, ask.time_s, partition.max_time_s, where,
                                f"MaxTime={slurm_time(partition.max_time_s)}"))
    named = qos.get(ask.qos) if ask.qos else None
    part = qos.get(partition.qos) if partition is not None and partition.qos else None
    order = [q for q in ((named, part) if named and named.over_part_qos else (part, named))
             if q is not None]
    for limit, attr, setting in ((Limit.GPUS_PER_JOB, "gpus_per_job", "MaxTRESPerJob"),
                                 (Limit.GPUS_PER_USER, "gpus_per_user", "MaxTRESPerUser")):
        first = next((q for q in order if getattr(q, attr) is not None), None)
        if first is not None and ask.gpus > getattr(first, attr):
            most = getattr(first, attr)
            found.append(Breach(limit, ask.gpus, most, f"QOS {first.name}",
                                f"{setting}=gres/gpu={most}"))
    return found


def _slurm(*argv: str) -> str | None:
    """A Slurm command's output; None when it fails or is missing (then Slurm decides)."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def partition(ask: Ask) -> Partition | None:
    """The partition ASK goes to (its own, else the default), as slurmctld shows it (None
    when it cannot be read: Slurm decides)."""
    listed = partitions(_slurm("scontrol", "show", "partition", "-o") or "")
    if ask.partition:
        return next((p for p in listed if p.name == ask.partition), None)
    return next((p for p in listed if p.default), None)


def qos_of(ask: Ask, part: Partition | None) -> dict[str, Qos]:
    """The QOS that bear on ASK (its --qos and its partition's), read from Slurm's
    accounting (slurmdbd: about a third of a second; nothing when it cannot be read)."""
    names = [n for n in (ask.qos, part.qos if part else None) if n]
    if not names:
        return {}
    return qoses(_slurm("sacctmgr", "-nP", "show", "qos", "where", f"name={','.join(names)}",
                        "format=name,maxtres,maxtrespu,flags") or "")
