"""The nodes' system metrics during a run (pure): the samples each node's supervisor
writes into its output every SYSTEM_INTERVAL seconds (node/sysmetrics.py), kept in the
run's timeline.jsonl as lines of their own (`{"t": ..., "system": {"node": ..., ...}}`,
beside the progress windows' points), and the rules that flag a node close to running out
of memory and a GPU idle for minutes while its run trains.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

from .. import defaults
from ..node.protocol import SYSTEM_INTERVAL
from ..node.sysmetrics import GPU_IDLE_PCT, Gpu

MEMORY_LOW = 0.05       # flagged: a node's available memory under 5 % of its total,
JOB_MEMORY_HIGH = 0.90  # or the job's processes there holding over 90 % of it
GIB = 1024 ** 3


def _int(raw: dict, key: str) -> int | None:
    value = raw.get(key)
    return None if value is None else int(value)


def _float(raw: dict, key: str) -> float | None:
    value = raw.get(key)
    return None if value is None else float(value)


@dataclass(frozen=True)
class Sample:
    """One node's system metrics at T (the node's clock); a field it could not read is
    None (no GPU fields without nvidia-smi)."""
    node: str
    t: float
    cpu_pct: float | None = None        # of all the node's CPUs since the last sample
    mem_total: int | None = None        # bytes
    mem_available: int | None = None    # bytes
    job_rss: int | None = None          # bytes resident in torchrun's process tree
    rx_bps: float | None = None         # bytes/s in on the cluster interface
    tx_bps: float | None = None         # bytes/s out on it
    gpus: tuple[Gpu, ...] = ()

    @property
    def mem_pct(self) -> float | None:
        if not self.mem_total or self.mem_available is None:
            return None
        return 100.0 * (self.mem_total - self.mem_available) / self.mem_total

    @classmethod
    def from_node(cls, node: str, raw: dict) -> Sample:
        """A sample as the node's supervisor wrote it (KeyError, TypeError, ValueError:
        it was not one)."""
        net = raw.get("net") or {}
        return cls(node, float(raw["t"]), _float(raw, "cpu_pct"), _int(raw, "mem_total"),
                   _int(raw, "mem_available"), _int(raw, "job_rss"),
                   _float(net, "rx_bps"), _float(net, "tx_bps"),
                   tuple(Gpu.from_json(g) for g in raw.get("gpus") or []))

    @classmethod
    def from_json(cls, raw: dict) -> Sample:
        """A timeline line as to_json wrote it (KeyError, TypeError, ValueError: it was
        not one: a progress window's point has no "system")."""
        system = raw["system"]
        return cls.from_node(str(system["node"]), {**system, "t": raw["t"]})

    def to_json(self) -> dict:
        fields = {"cpu_pct": self.cpu_pct, "mem_total": self.mem_total,
                  "mem_available": self.mem_available, "job_rss": self.job_rss}
        system: dict = {"node": self.node,
                        **{k: v for k, v in fields.items() if v is not None}}
        if self.rx_bps is not None and self.tx_bps is not None:
            system["net"] = {"rx_bps": self.rx_bps, "tx_bps": self.tx_bps}
        if self.gpus:
            system["gpus"] = [g.to_json() for g in self.gpus]
        return {"t": round(self.t, 3), "system": system}


def parse_system(node: str, text: str) -> Sample | None:
    """NODE's sample from the JSON that follows SYSTEM_MARKER on its line; None when it
    does not read (a line cut short)."""
    try:
        raw = json.loads(text)
        return Sample.from_node(node, raw) if isinstance(raw, dict) else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class FlagKind(str, Enum):
    MEMORY = "memory"       # the node is close to running out of memory
    GPU_IDLE = "gpu-idle"   # a GPU idle for --gpu-idle seconds or more


@dataclass(frozen=True)
class Flag:
    node: str
    kind: FlagKind
    t: float                  # the sample that raised it
    message: str
    gpu: int | None = None

    def to_json(self) -> dict:
        return {"node": self.node, "kind": self.kind.value, "t": round(self.t, 3),
                "message": self.message, **({"gpu": self.gpu} if self.gpu is not None else {})}


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def memory_flag(s: Sample) -> Flag | None:
    """S's node is close to running out of memory: under MEMORY_LOW of it available, or
    the job's processes hold over JOB_MEMORY_HIGH of it."""
    if not s.mem_total or s.mem_available is None:
        return None
    rss = s.job_rss or 0
    if s.mem_available >= MEMORY_LOW * s.mem_total and rss <= JOB_MEMORY_HIGH * s.mem_total:
        return None
    return Flag(s.node, FlagKind.MEMORY, s.t,
                f"{s.node} is close to running out of memory: {_gib(s.mem_available)} of "
                f"{_gib(s.mem_total)} available, the job's processes hold {_gib(rss)}")


def _lasting(seconds: float) -> str:
    return f"{seconds / 60:.0f} minutes" if seconds >= 120 else f"{seconds:.0f} s"


class SystemWatch:
    """Fed each node's samples in order (from one thread at a time): the flags, each said
    once per node (memory) or per GPU (idle for IDLE_S seconds; 0: never)."""

    def __init__(self, idle_s: float = defaults.GPU_IDLE) -> None:
        self.idle_s = idle_s
        self._idle_since: dict[tuple[str, int], float] = {}
        self._said: set[tuple[str, FlagKind, int | None]] = set()
        self.flags: list[Flag] = []

    def feed(self, s: Sample) -> list[Flag]:
        """The flags S raises that were not raised before."""
        found = [f for f in [memory_flag(s), *self._idle(s)] if f is not None]
        new = [f for f in found if (f.node, f.kind, f.gpu) not in self._said]
        self._said |= {(f.node, f.kind, f.gpu) for f in new}
        self.flags += new
        return new

    def _idle(self, s: Sample) -> list[Flag]:
        flags = []
        for g in s.gpus:
            key = (s.node, g.index)
            if g.util_pct > GPU_IDLE_PCT:
                self._idle_since.pop(key, None)
                continue
            since = self._idle_since.setdefault(key, s.t)
            if self.idle_s and s.t - since >= self.idle_s:
                flags.append(Flag(s.node, FlagKind.GPU_IDLE, s.t,
                                  f"{s.node} GPU {g.index} idle ({g.util_pct:g} % used) for "
                                  f"{_lasting(s.t - since)} while the run trains", g.index))
        return flags


def flags_of(samples: list[Sample], idle_s: float = defaults.GPU_IDLE) -> list[Flag]:
    """The flags of a run's samples, in the order they were raised (a live run's report)."""
    watch = SystemWatch(idle_s)
    for s in sorted(samples, key=lambda s: s.t):
        watch.feed(s)
    return watch.flags


GAP_S = 2.5 * SYSTEM_INTERVAL   # samples further apart: the node's line is cut there

