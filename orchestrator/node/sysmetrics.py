"""The node's system metrics while a run lives (standard library only): every
SYSTEM_INTERVAL seconds the supervisor appends one line to the job's output,

    @@clustertrain-system {"t": ..., "cpu_pct": ..., "mem_total": ..., ...}

with the node's CPU use (/proc/stat) and memory (/proc/meminfo), the resident memory of
torchrun's whole process tree (util.process_table), the traffic of the interface that
carries the node's cluster address (/proc/net/dev, the interface by /proc/net/route), and each
GPU's utilisation and memory when nvidia-smi is on PATH: the run's GPUs only, those
CUDA_VISIBLE_DEVICES names when it does (a node Slurm shares: another user's GPU is not
in this run's samples, its charts or its idle flags). The controller keeps the lines in
the run's timeline (record/system.py), never on the terminal. One sample reads a few
/proc files and one short line per process of the node; nothing is read in between.

The parsers are pure (text in, numbers out); `Sampler` holds the counters between two
samples; `OutputLines` appends the lines and keeps them from counting as the job's output
for the node's hang watch (supervise.py `_quiet_for`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from .protocol import SYSTEM_INTERVAL, SYSTEM_MARKER
from .util import Proc, process_table

NVIDIA_SMI = "nvidia-smi"
SMI_QUERY = ["--query-gpu=index,utilization.gpu,memory.used,memory.total",
             "--format=csv,noheader,nounits"]
SMI_TIMEOUT = 5.0    # seconds: a driver that does not answer costs one sample its GPUs
MIB = 1024 * 1024
GPU_IDLE_PCT = 1.0   # a GPU at or under this utilisation is idle (here, and the controller's
                     # flag of a GPU idle for train's --gpu-idle seconds: record/system.py)


# -- pure parsers ---------------------------------------------------------------------------
def parse_cpu(stat: str) -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat's first line ("cpu  user nice
    system idle iowait irq softirq steal ..."); idle and iowait are not busy. ValueError
    when there is no such line."""
    for line in stat.splitlines():
        words = line.split()
        if words and words[0] == "cpu":
            ticks = [int(w) for w in words[1:9]]
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
            return sum(ticks) - idle, sum(ticks)
    raise ValueError("no 'cpu' line in /proc/stat")


def parse_meminfo(meminfo: str) -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo (kB there). ValueError when
    either is missing."""
    found: dict[str, int] = {}
    for line in meminfo.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            found[key] = int(rest.split()[0]) * 1024
    if len(found) < 2:
        raise ValueError("/proc/meminfo lacks MemTotal or MemAvailable")
    return found["MemTotal"], found["MemAvailable"]


def tree_rss(table: dict[int, Proc], root: int, page: int) -> int | None:
    """Bytes resident in ROOT and every process below it (TABLE: util.process_table); None
    once ROOT has ended (gone, or a zombie not yet reaped)."""
    if root not in table or table[root].state == "Z":
        return None
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += table[pid].rss_pages if pid in table else 0
        todo += children.get(pid, [])
    return total * page


def parse_net_dev(text: str, iface: str) -> tuple[int, int]:
    """(bytes received, bytes sent) by IFACE from /proc/net/dev. KeyError: no such one."""
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if sep and name.strip() == iface:
            words = rest.split()
            return int(words[0]), int(words[8])
    raise KeyError(iface)


def interface_for(address: str, route: str) -> str | None:
    """The interface that carries ADDRESS (an IPv4 address), by /proc/net/route's longest
    matching prefix; "lo" for a loopback address; None when no route holds it."""
    ip = ipaddress.IPv4Address(address)
    if ip.is_loopback:
        return "lo"
    best: tuple[int, str] | None = None
    for line in route.splitlines()[1:]:
        words = line.split()
        if len(words) < 8:
            continue
        try:   # little-endian hex, as the kernel writes them
            dest = int.from_bytes(bytes.fromhex(words[1]), "little")
            mask = int.from_bytes(bytes.fromhex(words[7]), "little")
        except ValueError:
            continue
        if int(ip) & mask == dest & mask:
            bits = bin(mask).count("1")
            if best is None or bits > best[0]:
                best = (bits, words[0])
    return best[1] if best else None


@dataclass(frozen=True)
class Gpu:
    """One GPU in a sample (the controller reads it back: record/system.py)."""
    index: int
    util_pct: float
    mem_used: int     # bytes
    mem_total: int    # bytes

    @classmethod
    def from_json(cls, raw: dict) -> Gpu:
        return cls(int(raw["index"]), float(raw["util_pct"]), int(raw["mem_used"]),
                   int(raw["mem_total"]))

    def to_json(self) -> dict:
        return {"index": self.index, "util_pct": self.util_pct, "mem_used": self.mem_used,
                "mem_total": self.mem_total}


def parse_smi(text: str) -> list[Gpu]:
    """Each GPU of nvidia-smi's CSV (SMI_QUERY: index, utilisation %, memory used and total
    in MiB); a line that does not read ("[N/A]") is left out."""
    gpus = []
    for line in text.splitlines():
        words = [w.strip() for w in line.split(",")]
        if len(words) != 4:
            continue
        try:
            gpus.append(Gpu(int(words[0]), float(words[1]), int(float(words[2]) * MIB),
                            int(float(words[3]) * MIB)))
        except ValueError:
            continue
    return gpus


# -- reading this node -----------------------------------------------------------------------
def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as fh:
        return fh.read()


def own_address(address: str) -> str | None:
    """This node's cluster address (a name resolved), None when it has no IPv4 one."""
    try:
        return str(ipaddress.IPv4Address(socket.gethostbyname(address)))
    except (OSError, ValueError):
        return None


class Sampler:
    """The node's metrics since the last sample: rates (CPU %, bytes/s) need the counters
    of the one before, which the first sample takes when the sampler is made."""

    def __init__(self, root_pid: int, address: str | None) -> None:
        self.root_pid = root_pid
        ip = own_address(address) if address else None
        try:
            self.iface = interface_for(ip, _read("/proc/net/route")) if ip else None
        except OSError:
            self.iface = None
        self.smi = shutil.which(NVIDIA_SMI)
        self.visible = visible_gpus()   # the run's GPUs: a neighbour's are not its to see
        self.page = os.sysconf("SC_PAGE_SIZE")
        self._before = self._counters()

    def _counters(self) -> tuple[float, tuple[int, int] | None, tuple[int, int] | None]:
        cpu = net = None
        try:
            cpu = parse_cpu(_read("/proc/stat"))
        except (OSError, ValueError):
            pass
        if self.iface:
            try:
                net = parse_net_dev(_read("/proc/net/dev"), self.iface)
            except (OSError, ValueError, KeyError):
                pass
        return time.monotonic(), cpu, net

    def sample(self) -> dict | None:
        """One sample as the line's JSON; a field that cannot be read now is left out. None
        once the job has ended (its root gone or a zombie): the run's samples are of the
        run."""
        rss = tree_rss(process_table(), self.root_pid, self.page)
        if rss is None:
            return None
        (was, cpu0, net0), (now, cpu1, net1) = self._before, self._counters()
        self._before = (now, cpu1, net1)
        out: dict = {"t": round(time.time(), 3)}
        if cpu0 and cpu1 and cpu1[1] > cpu0[1]:
            out["cpu_pct"] = round(100 * (cpu1[0] - cpu0[0]) / (cpu1[1] - cpu0[1]), 1)
        try:
            out["mem_total"], out["mem_available"] = parse_meminfo(_read("/proc/meminfo"))
        except (OSError, ValueError):
            pass
        out["job_rss"] = rss
        if net0 and net1 and now > was:
            out["net"] = {"iface": self.iface,
                          "rx_bps": round(max(0, net1[0] - net0[0]) / (now - was)),
                          "tx_bps": round(max(0, net1[1] - net0[1]) / (now - was))}
        if self.smi:
            gpus = self._gpus()
            if gpus is not None:
                out["gpus"] = [g.to_json() for g in gpus]
        return out

    def _gpus(self) -> list[Gpu] | None:
        assert self.smi is not None
        try:
            done = subprocess.run([self.smi, *SMI_QUERY], capture_output=True, text=True,
                                  timeout=SMI_TIMEOUT, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        return [g for g in parse_smi(done.stdout)
                if self.visible is None or g.index in self.visible]


def visible_gpus(environ: dict[str, str] | os._Environ[str] = os.environ) -> set[int] | None:
    """The node's GPUs this run was given, by index (CUDA_VISIBLE_DEVICES: Slurm's choice,
    read as CUDA reads it: up to the first invalid index; empty, or -1: none); None when it
    is not set, or names GPUs by UUID (no index to match: every GPU of the node counts)."""
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    given: set[int] = set()
    for word in (w.strip() for w in raw.split(",")):
        if word and not word.lstrip("-").isdigit():
            return None
        if not word or int(word) < 0:
            break
        given.add(int(word))
    return given


class IdleGpus:
    """GPU-seconds of a run's GPUs (those of its samples) that did nothing: between two
    samples, each GPU at or under GPU_IDLE_PCT in the second counts the time between them.
    For `usage`'s idle GPU-hours (node/usage.py)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._last: float | None = None

    def add(self, sample: dict) -> float:
        """Count SAMPLE (the sampler's JSON); the idle GPU-seconds so far."""
        t, last = sample.get("t"), self._last
        if not isinstance(t, (int, float)):
            return self.seconds
        self._last = float(t)
        if last is None or t <= last:
            return self.seconds
        idle = [g for g in sample.get("gpus") or []
                if float(g.get("util_pct", 100.0)) <= GPU_IDLE_PCT]
        self.seconds += len(idle) * (float(t) - last)
        return self.seconds


class OutputLines:
    """The supervisor's own lines in the job's output (JOB/output.log): each appended in
    one write (O_APPEND: never inside another writer's line), and remembered so that they
    do not count as the job's output (`last_output`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._mark: tuple[int, float] | None = None   # (size after our line, job's mtime)

    def append(self, line: str) -> None:
        data = (line.rstrip("\n") + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            before = os.fstat(fd)
            os.write(fd, data)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        job = before.st_mtime
        mark = self._mark
        if mark is not None and before.st_size == mark[0]:
            job = mark[1]   # nothing written since our last line either
        # Another writer between the two looks: its output counts (the log's own time).
        self._mark = (after.st_size, job) if after.st_size == before.st_size + len(data) \
            else None

    def last_output(self, st: os.stat_result) -> float:
        """When the job last wrote to its output, ST being the log's stat now."""
        mark = self._mark
        return mark[1] if mark is not None and st.st_size == mark[0] else st.st_mtime


def system_line(sample: dict) -> str:
    return f"{SYSTEM_MARKER} {json.dumps(sample, separators=(',', ':'))}"


def keep_sampling(sampler: Sampler, lines: OutputLines, stop: threading.Event,
                  interval: float = SYSTEM_INTERVAL,
                  seen: Callable[[dict], None] = lambda sample: None) -> None:
    """A sample every INTERVAL into the job's output (and to SEEN) until STOP or the job's
    end; a sample that fails is said once in the supervisor's log and the next one tried."""
    said = False
    while not stop.wait(interval):
        try:
            sample = sampler.sample()
            if sample is None:
                return
            lines.append(system_line(sample))
            seen(sample)
        except Exception:  # noqa: BLE001 - metrics never end a run
            if not said:
                said = True
                traceback.print_exc()


def start(root_pid: int, address: str | None, output: OutputLines,
          seen: Callable[[dict], None] = lambda sample: None) -> threading.Event:
    """Sample this node beside the run (a daemon thread), each sample also to SEEN; set the
    event it returns to stop. The thread makes its sampler (the address resolved, the
    first counters read) at once, while torchrun starts: a name slow to resolve never holds
    up the supervisor."""
    stop = threading.Event()
    threading.Thread(target=lambda: keep_sampling(Sampler(root_pid, address), output, stop,
                                                  seen=seen),
                     daemon=True, name="sysmetrics").start()
    return stop
