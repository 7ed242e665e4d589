"""`doctor`: measure every link and every node through the same launch as a job, and name
the nodes that fall far below the others (run_doctor); the analysis (analyse) and the
report (render, DoctorReport.to_json).

The measurements run on the nodes as the run's module (orchestrator/node/doctor.py, in the
node package: nothing is synced); rank 0 prints
them as one line, read here from node 0's log of the run (runs/RUN/), and the analysis
goes beside it as runs/RUN/doctor.json.

A node is a suspect when one of its numbers is worse than the others' by a margin that
noise does not reach (`thresholds()`): its median link bandwidth out (or in), or the
matrix products of one of its ranks, below SLOW_RATIO x the median of the other nodes'
(ranks') and, with 4 nodes or more, more than MAD_K scaled median absolute deviations of
theirs below it; its median round trip above LATENCY_RATIO x the others' median and as
many deviations above it; or a GPU that nvidia-smi reports unwell. A single link that is slow
by the same rule, between nodes that are not suspects already, names both its ends.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

from .. import defaults
from ..cluster.drain import clear_cordons, keep_out
from ..cluster.inventory import Cluster
from ..errors import ClusterError, LaunchError
from ..node import doctor as node_doctor
from ..record.rundir import RunDir, new_run_id
from ..report.page import try_write_report
from ..run.lifecycle import choose_nodes, run_training
from ..run.spec import RunSpec, check_measures

K = TypeVar("K")
SLOW_RATIO = node_doctor.SLOW_RATIO   # below half the median: slow
LATENCY_RATIO = 3.0     # round trips over 3x the median: slow
MAD_K = 2.0             # and that many scaled MADs from the median,
MAD_MIN_OTHERS = 3      # when there are this many others to take a MAD of (4 nodes)
MAD_SCALE = 1.4826      # MAD x this estimates the standard deviation of normal noise
# nvidia-smi's clock event reasons that slow a GPU down for a fault, not by choice:
# HW slowdown, SW thermal, HW thermal, HW power brake (nvml's bit values).
BAD_CLOCK_EVENTS = {0x8: "hardware slowdown", 0x20: "software thermal slowdown",
                    0x40: "hardware thermal slowdown", 0x80: "hardware power brake"}


DOCTOR_MODULE = node_doctor.__name__   # orchestrator.node.doctor, run from the node package
@dataclass(frozen=True)
class DoctorRequest:
    link_seconds: float = node_doctor.LINK_SECONDS
    pings: int = node_doctor.PINGS
    compute_seconds: float = node_doctor.COMPUTE_SECONDS
    allreduce_mb: float = node_doctor.ALLREDUCE_MB
    allreduce_iters: int = node_doctor.ALLREDUCE_ITERS
    runs_dir: Path = defaults.RUNS_DIR
    master_port: int | None = None
    share_gpus: bool = False   # measure beside another run (its numbers then tell of both)

    def __post_init__(self) -> None:
        check_measures(self.link_seconds, self.allreduce_mb, compute_seconds=self.compute_seconds)
        for name in ("pings", "allreduce_iters"):
            if not 1 <= getattr(self, name) <= 10000:
                raise LaunchError(f"--{name.replace('_', '-')} {getattr(self, name)}: give "
                                  "a whole number from 1 to 10000")

    def script_args(self, addresses: list[str]) -> tuple[str, ...]:
        return ("--addresses", ",".join(addresses), "--link-seconds", f"{self.link_seconds:g}",
                "--pings", str(self.pings), "--compute-seconds", f"{self.compute_seconds:g}",
                "--allreduce-mb", f"{self.allreduce_mb:g}",
                "--allreduce-iters", str(self.allreduce_iters))


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    gbit_s: float
    latency_ms: float | None   # the median round trip of one byte
    error: str | None = None   # the link could not be measured: what failed


@dataclass(frozen=True)
class Gpu:
    """One GPU's health, from nvidia-smi (None: the field is not supported, [N/A])."""
    index: int
    bus_id: str
    name: str
    ecc_uncorrected: int | None
    clock_events: int | None
    sm_clock_mhz: int | None
    max_sm_clock_mhz: int | None
    pcie_width: int | None
    max_pcie_width: int | None
    temperature_c: int | None

    def problems(self) -> list[str]:
        found = []
        if self.ecc_uncorrected:
            found.append(f"{self.ecc_uncorrected} uncorrected ECC error(s)")
        if self.clock_events:
            found += [f"clocks held down: {what}" for bit, what in BAD_CLOCK_EVENTS.items()
                      if self.clock_events & bit]
        if self.pcie_width and self.max_pcie_width and self.pcie_width < self.max_pcie_width:
            found.append(f"PCIe link x{self.pcie_width} of x{self.max_pcie_width}")
        return [f"GPU {self.index} ({self.bus_id}): {p}" for p in found]


@dataclass(frozen=True)
class NodeReport:
    name: str
    send_gbit_s: float | None     # the median of its links out
    recv_gbit_s: float | None     # the median of its links in
    latency_ms: float | None      # the median round trip of its links
    gflops: list[float]           # per rank (GPU), in local rank order
    device: str
    gpus: list[Gpu] = field(default_factory=list)
    gpu_error: str | None = None  # nvidia-smi failed: its words


@dataclass(frozen=True)
class Suspect:
    node: str
    why: str


@dataclass
class DoctorReport:
    run_id: str
    links: list[Link]
    nodes: list[NodeReport]
    allreduce: dict
    suspects: list[Suspect]
    cordoned: dict[str, str] = field(default_factory=dict)  # the share's record: {node: why}
    drained: dict[str, str] = field(default_factory=dict)   # in Slurm: {node: reason}
    uncordoned: list[str] = field(default_factory=list)     # cordoned before, clean now

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "links": [asdict(lk) for lk in self.links],
                "nodes": [asdict(n) for n in self.nodes], "allreduce": self.allreduce,
                "suspects": [asdict(s) for s in self.suspects], "cordoned": self.cordoned,
                "drained": self.drained, "uncordoned": self.uncordoned,
                "thresholds": thresholds()}


def thresholds() -> dict:
    """The rule that makes a suspect, as the report shows it."""
    return {"slow_ratio": SLOW_RATIO, "latency_ratio": LATENCY_RATIO, "mad_k": MAD_K,
            "rule": f"bandwidth or GFLOP/s below {SLOW_RATIO:g} x the median of the others, "
                    f"round trip above {LATENCY_RATIO:g} x theirs, and (4 nodes or more) over "
                    f"{MAD_K:g} of their scaled MADs from it; a slow link names both ends; or "
                    "a GPU that nvidia-smi reports unwell"}


# --- running it ----------------------------------------------------------------------

def run_doctor(cluster: Cluster, request: DoctorRequest) -> DoctorReport:
    """Run the measurements on CLUSTER's nodes as a job (the lifecycle's, which runs every
    job: preflight, torchrun on every node, logs under runs/), analyse them and keep the
    analysis as doctor.json."""
    if len(cluster.nodes) < 2:
        raise LaunchError(f"doctor compares the nodes with each other (their links, their "
                          f"GFLOP/s), and {cluster.names[0]} alone has nothing to be "
                          "compared with: choose 2 nodes or more (--nodes, --hosts)")
    run_id = new_run_id()
    spec = RunSpec(inventory=cluster.inventory, hosts=tuple(cluster.names), workdir=None,
                   script=DOCTOR_MODULE, module=True,
                   script_args=request.script_args([n.cluster_address for n in cluster.nodes]),
                   master_port=request.master_port, runs_dir=request.runs_dir,
                   hang_timeout=defaults.DOCTOR_HANG_TIMEOUT, run_id=run_id,
                   share_gpus=request.share_gpus, cordoned_ok=True)
    code = run_training(spec, nodes=choose_nodes(spec, cluster))  # raises on failure
    run = RunDir(request.runs_dir, run_id)
    if code == 130:   # Ctrl-C: the run was stopped on every node and recorded
        raise KeyboardInterrupt
    if code != 0:
        raise LaunchError(f"doctor's run {run_id} ended with status {code}; its logs: "
                          f"{run.path}/")
    report = analyse(run_id, read_result(run.log(cluster.names[0])), cluster.names)
    whys: dict[str, list[str]] = {}
    for suspect in report.suspects:
        whys.setdefault(suspect.node, []).append(suspect.why)
    kept = keep_out(cluster, {node: f"{node} named by doctor (run {run_id}): "
                              + "; ".join(why) for node, why in whys.items()}, run_id)
    report.cordoned, report.drained = kept.cordoned, kept.drained
    # A clean doctor on a cordoned node returns it, as its user: by the rule of `uncordon`
    # (its own cordons; every one when its user is an admin), to Slurm too.
    report.uncordoned = clear_cordons(cluster, [n for n in cluster.names if n not in whys],
                                      f"clean doctor run {run_id}")
    run.write_json("doctor.json", report.to_json())
    try_write_report(run)   # drawn again with the analysis
    return report


def doctor_first(spec: RunSpec, cluster: Cluster, dry_run: bool) -> None:
    """`train --doctor`: doctor on the chosen nodes first; nothing starts on a suspect
    (unless --ignore-suspects). Doctor is a run itself: a dry run does not run it."""
    if dry_run:
        print("# dry run: `doctor` would run first on these nodes; it was not run")
        return
    report = run_doctor(cluster, DoctorRequest(
        link_seconds=spec.link_seconds, allreduce_mb=spec.allreduce_mb,
        runs_dir=spec.runs_dir, master_port=spec.master_port, share_gpus=spec.share_gpus))
    print(render(report))
    if report.suspects and not spec.ignore_suspects:
        raise LaunchError(
            f"doctor (run {report.run_id}) names "
            + "; ".join(f"{s.node}: {s.why}" for s in report.suspects)
            + ". Nothing was started: leave the node out (--hosts), fix it, or start "
            "anyway with --ignore-suspects")


def read_result(log: Path) -> dict:
    """Rank 0's result line in node 0's log of the doctor's run."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise ClusterError(f"doctor: cannot read the run's log {log}: {exc}") from None
    for line in reversed(lines):
        if node_doctor.RESULT_MARK in line:
            return json.loads(line.split(node_doctor.RESULT_MARK, 1)[1])
    raise ClusterError(f"doctor: the run ended without its results in {log}; see that log")


# --- the analysis ----------------------------------------------------------------------

def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def outliers(values: dict[K, float], ratio: float, high: bool = False) -> dict[K, float]:
    """The keys of VALUES that are far from the others, each with its reference: the
    median of the other values. Far: below RATIO x that median (above it, with HIGH) and,
    with MAD_MIN_OTHERS others or more, over MAD_K of their scaled MADs away from it. A
    value is judged against the others only, so that it never widens its own yardstick:
    among three nodes, one slow node's own distance made the MAD of all three as wide as
    itself. Two others' MAD is half their difference, too unsteady to judge by."""
    found = {}
    for key, x in values.items():
        others = [v for k, v in values.items() if k != key]
        if not others:
            continue
        reference = statistics.median(others)
        spread = MAD_SCALE * statistics.median(abs(v - reference) for v in others) \
            if len(others) >= MAD_MIN_OTHERS else 0.0
        if (x > ratio * reference and x > reference + MAD_K * spread) if high else \
                (x < ratio * reference and x < reference - MAD_K * spread):
            found[key] = reference
    return found


def parse_gpus(text: str | None) -> tuple[list[Gpu], str | None]:
    """nvidia-smi's CSV of node_doctor.GPU_FIELDS: the GPUs, or an error to show."""
    if text is None:
        return [], None
    if text.startswith("error:"):
        return [], text[len("error:"):].strip()

    def number(value: str, base: int = 10) -> int | None:
        try:
            return int(value.strip(), base)
        except ValueError:
            return None   # [N/A], [Not Supported]

    gpus: list[Gpu] = []
    for row in text.strip().splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) != len(node_doctor.GPU_FIELDS):
            return gpus, f"unexpected nvidia-smi line: {row!r}"
        index, bus, name, ecc, events, sm, max_sm, width, max_width, temp = cells
        gpus.append(Gpu(index=number(index) or 0, bus_id=bus, name=name,
                        ecc_uncorrected=number(ecc), clock_events=number(events, 16),
                        sm_clock_mhz=number(sm), max_sm_clock_mhz=number(max_sm),
                        pcie_width=number(width), max_pcie_width=number(max_width),
                        temperature_c=number(temp)))
    return gpus, None


def analyse(run_id: str, result: dict, names: list[str]) -> DoctorReport:
    """The doctor job's RESULT (node ranks) as a report on the nodes NAMES, with suspects."""
    every = [Link(names[lk["src"]], names[lk["dst"]], lk["gbit_s"], lk["latency_ms"],
                  lk.get("error")) for lk in result["links"]]
    broken = [lk for lk in every if lk.error]
    links = [lk for lk in every if not lk.error]   # the numbers are judged without them
    ranks = sorted(result["ranks"], key=lambda r: (r["node"], r["local_rank"]))
    suspects: dict[str, list[str]] = {n: [] for n in names}

    def by_node(pick: Callable[[Link], str], among: list[Link]) -> dict[str, float]:
        return {n: m for n in names
                if (m := _median([lk.gbit_s for lk in among if pick(lk) == n])) is not None}

    for lk in broken:   # both directions fail together: say it once, at both ends
        if lk.src < lk.dst:
            for n in (lk.src, lk.dst):
                suspects[n].append(f"link {lk.src} <-> {lk.dst} failed: {lk.error}")
    send = by_node(lambda lk: lk.src, links)
    for n, ref in outliers(send, SLOW_RATIO).items():
        suspects[n].append(f"sends at {send[n]:.3g} Gbit/s (median of its links out; the "
                           f"other nodes' median {ref:.3g})")
    recv = by_node(lambda lk: lk.dst, links)
    # Links from a node that sends slowly say nothing of the receiver: judged without them.
    slow_senders = {n for n, why in suspects.items() if why}
    judged = by_node(lambda lk: lk.dst, [lk for lk in links if lk.src not in slow_senders])
    for n, ref in outliers(judged, SLOW_RATIO).items():
        suspects[n].append(f"receives at {judged[n]:.3g} Gbit/s (median of its links in "
                           f"from nodes that send normally; the other nodes' median {ref:.3g})")
    # A slow link between nodes that are otherwise fine (a cable, a switch port): both ends.
    explained = {n for n, why in suspects.items() if why}
    by_link = {(lk.src, lk.dst): lk.gbit_s for lk in links}
    for (src, dst), ref in outliers(by_link, SLOW_RATIO).items():
        if src not in explained and dst not in explained:
            for n in (src, dst):
                suspects[n].append(f"link {src} -> {dst} runs at {by_link[src, dst]:.3g} "
                                   f"Gbit/s (the other links' median {ref:.3g})")
    latency = {n: m for n in names if (m := _median(
        [lk.latency_ms for lk in links if n in (lk.src, lk.dst) and lk.latency_ms is not None]))
        is not None}
    for n, ref in outliers(latency, LATENCY_RATIO, high=True).items():
        suspects[n].append(f"round trips take {latency[n]:.3g} ms (median of its links; "
                           f"the other nodes' median {ref:.3g})")
    gflops = {f"{names[r['node']]}/{r['local_rank']}": r["gflops"] for r in ranks}
    for key, ref in outliers(gflops, SLOW_RATIO).items():
        node, local = key.split("/")
        suspects[node].append(f"rank {local} computes {gflops[key]:.3g} GFLOP/s (the ranks' "
                              f"median {ref:.3g})")
    nodes = []
    for i, n in enumerate(names):
        gpus, error = parse_gpus(result.get("gpus", {}).get(str(i)))
        for gpu in gpus:
            suspects[n] += gpu.problems()
        mine = [r for r in ranks if r["node"] == i]
        nodes.append(NodeReport(name=n, send_gbit_s=send.get(n), recv_gbit_s=recv.get(n),
                                latency_ms=latency.get(n), gflops=[r["gflops"] for r in mine],
                                device=mine[0]["device"] if mine else "?", gpus=gpus,
                                gpu_error=error))
    return DoctorReport(run_id=run_id, links=every, nodes=nodes,
                        allreduce=result["allreduce"],
                        suspects=[Suspect(n, "; ".join(why)) for n, why in suspects.items()
                                  if why])


# --- the report ------------------------------------------------------------------------

def render(report: DoctorReport) -> str:
    names = [n.name for n in report.nodes]
    speed = {(lk.src, lk.dst): "failed" if lk.error else f"{lk.gbit_s:.3g}"
             for lk in report.links}
    width = max(8, *(len(n) for n in names))
    lines = [f"links, Gbit/s (row sends to column; {len(report.links)} measured in rounds "
             "of disjoint pairs):",
             " " * width + "".join(f" {n:>{width}}" for n in names)]
    for src in names:
        cells = "".join(f" {speed[(src, dst)]:>{width}}" if (src, dst) in speed
                        else f" {'-':>{width}}" for dst in names)
        lines.append(f"{src:<{width}}{cells}")
    lines += ["", f"{'node':<{width}} {'out Gbit/s':>10} {'in Gbit/s':>10} {'rtt ms':>8} "
              f"{'GFLOP/s':>10}  device"]

    def num(x: float | None, w: int) -> str:
        return f"{x:>{w}.3g}" if x is not None else f"{'-':>{w}}"

    for n in report.nodes:
        lines.append(f"{n.name:<{width}} {num(n.send_gbit_s, 10)} {num(n.recv_gbit_s, 10)} "
                     f"{num(n.latency_ms, 8)} {num(min(n.gflops) if n.gflops else None, 10)}"
                     f"  {n.device}" + (f" x{len(n.gflops)}" if len(n.gflops) > 1 else ""))
        for gpu in n.gpus:
            lines.append(f"{'':<{width}}   GPU {gpu.index} {gpu.bus_id}: ECC uncorrected "
                         f"{gpu.ecc_uncorrected if gpu.ecc_uncorrected is not None else '-'}, "
                         f"SM {gpu.sm_clock_mhz or '-'}/{gpu.max_sm_clock_mhz or '-'} MHz, "
                         f"PCIe x{gpu.pcie_width or '-'}/x{gpu.max_pcie_width or '-'}, "
                         f"{gpu.temperature_c if gpu.temperature_c is not None else '-'} C")
        if n.gpu_error:
            lines.append(f"{'':<{width}}   nvidia-smi failed: {n.gpu_error}")
    ar = report.allreduce
    lines += ["", f"all_reduce ({ar['backend']}, {ar['ranks']} ranks, "
              f"{ar['bytes'] / 1e6:.3g} MB): {ar['seconds'] * 1000:.3g} ms, algbw "
              f"{ar['algbw_gbyte_s']:.3g} GB/s, busbw {ar['busbw_gbyte_s']:.3g} GB/s "
              f"({ar['busbw_gbyte_s'] * 8:.3g} Gbit/s)",
              f"suspect when: {thresholds()['rule']}"]
    if report.suspects:
        lines += ["suspects:"] + [f"  {s.node}: {s.why}" for s in report.suspects]
    else:
        lines.append("suspects: none")
    return "\n".join(lines)
