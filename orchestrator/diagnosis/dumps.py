"""`diagnose RUN`: a Python stack and the flight recorder of every rank of a running
run, and which rank holds the others up (orchestrator/diagnosis/hang.py reads both).

Each node dumps its own workers at once (the node package's `dump` verb, run as the job's
user): py-spy reads that user's processes without extra rights, and each worker's runner
answers with torch's own dump of its flight recorder (node/worker.py). The dumps, per rank
NODE-rankR.json (py-spy) and NODE-rankR.fr.pkl (flight recorder), and the report go to a
directory of the run's record: `hang/` when the controller found the run hung,
`diagnose/<time>/` on demand. Diagnosing reads the processes for a moment and does not
disturb the run.

The stacks name a rank that is elsewhere than the others in Python (a data loader, a
different collective). The flight recorder adds the collectives' sequence numbers, and
names the rank that is behind when the stacks cannot tell: NCCL collectives run on the
GPU, so every rank's Python may have gone past the call and wait in the same place.
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cluster import nodelib, ssh
from ..cluster.fanout import each
from ..cluster.inventory import NodeSpec
from ..errors import DiagnoseError
from ..node.answers import DumpAnswer, RankDump
from ..node.dump import py_spy_for
from ..node.protocol import JOBS_DIR
from ..node.requests import Dump
from ..record.rundir import iso, private_dir, write_private
from .hang import (
    FlightRecord,
    HangAnalysis,
    RankId,
    RankStacks,
    analyze_flight_records,
    analyze_stacks,
    blame_survivors,
    locate,
    parse_flight_record,
    parse_pyspy_dump,
)

NODE_TIMEOUT = 90.0  # seconds for one node's dumps (py-spy's own limit is 30 s a rank)


@dataclass(frozen=True)
class Target:
    """One node of the run to dump: how to reach it and where its tools are."""

    node: str
    conn: ssh.Connection
    python: str   # the node's system python, which runs the supervisor's source
    py_spy: str


@dataclass
class NodeDumps:
    node: str
    ranks: list[RankDump] = field(default_factory=list)  # each worker's, as `dump` answers
    error: str | None = None                              # the node could not be dumped


def dump_node(target: Target, run_id: str, native: bool = False) -> NodeDumps:
    try:
        ranks = nodelib.ask(target.conn, target.python,
                            Dump(JOBS_DIR, run_id, target.py_spy, native),
                            node=target.node, timeout=NODE_TIMEOUT).ranks
    except nodelib.NodeAnswerError as exc:
        return NodeDumps(target.node, error=f"the dump failed: {exc}")
    if not ranks:
        return NodeDumps(target.node, error="no worker of this run runs there")
    return NodeDumps(target.node, ranks)


def collect(targets: list[Target], run_id: str, native: bool = False) -> list[NodeDumps]:
    """Every node's dumps, taken at the same time on all nodes."""
    results = each(targets, lambda t: dump_node(t, run_id, native), lambda t: t.node)
    return [r.value if r.value is not None else NodeDumps(r.node, error=str(r.error))
            for r in results.values()]


@dataclass
class Diagnosis:
    stacks: HangAnalysis | None     # from py-spy; None: no rank could be dumped
    flight: HangAnalysis | None     # from the flight recorders; None: none came
    directory: Path                 # the dumps (files per rank) and report.txt
    missing: list[str]              # what could not be dumped, and why

    @property
    def analysis(self) -> HangAnalysis | None:
        """The one that names suspects: the stacks' where they do, else the recorders'."""
        if self.stacks and (self.stacks.suspects or not (self.flight and self.flight.suspects)):
            return self.stacks
        return self.flight or self.stacks

    def nobody(self) -> str:
        """Why nobody is named when no rank could be dumped."""
        if self.missing:
            return "no rank could be dumped, so nobody can be named"
        return ("no worker process was found on any node, so nobody can be named: torchrun "
                "had not started its workers (still in its rendezvous, waiting for a node?)")

    def report(self) -> str:
        found = [a for a in (self.analysis, self.flight, self.stacks) if a]
        lines = [a.report() for i, a in enumerate(found) if a not in found[:i]] or [
            self.nobody()[0].upper() + self.nobody()[1:] + "."]
        lines += [f"  not dumped: {m}" for m in self.missing]
        if any("py-spy" in m and ("No such file" in m or "not found" in m)
               for m in self.missing):
            lines.append("  py-spy is missing from the training environment there: "
                         "provision the nodes again (`ansible-playbook site.yml`); "
                         "environment.yml carries py-spy")
        lines.append(f"Dumps and this report: {self.directory}/")
        return "\n".join(lines)

    def to_json(self) -> dict:
        chosen = self.analysis
        return {"suspects": chosen.to_json()["suspects"] if chosen else [],
                "source": chosen.source if chosen else None,
                "dumps": str(self.directory),
                "verdict": chosen.verdict if chosen else self.nobody(),
                "flight_recorder": ({"verdict": self.flight.verdict, **self.flight.to_json()}
                                    if self.flight else None),
                "not_dumped": self.missing}


SAMPLES = 3           # dumps taken of every rank, INTERVAL apart: a hang holds still
INTERVAL = 1.0


def sample(targets: list[Target], run_id: str, samples: int = SAMPLES,
           interval: float = INTERVAL, native: bool = False) -> list[list[NodeDumps]]:
    """SAMPLES rounds of every node's dumps."""
    rounds = []
    for i in range(samples):
        if i:
            time.sleep(interval)
        rounds.append(collect(targets, run_id, native))
    return rounds


@dataclass
class Round:
    """One sample of every rank: what could be read of it."""

    stacks: list[RankStacks] = field(default_factory=list)
    records: list[FlightRecord] = field(default_factory=list)


def _read_round(dumps: list[NodeDumps], into: Path, suffix: str,
                missing: list[str]) -> Round:
    found = Round()
    for node in dumps:
        if node.error:
            missing.append(f"{node.node}: {node.error}")
            continue
        for entry in node.ranks:
            rank = RankId(node.node, entry.rank, entry.pid)
            name = f"{node.node}-rank{rank.rank}{suffix}"
            if entry.dump is not None:
                write_private(into / f"{name}.json", entry.dump)
                try:
                    found.stacks.append(parse_pyspy_dump(entry.dump, rank))
                except DiagnoseError as exc:
                    missing.append(str(exc))
            else:
                missing.append(f"rank {rank.rank} on {node.node} (pid {rank.pid}): "
                               f"py-spy: {entry.error or 'no output'}")
            if entry.fr is not None:
                data = zlib.decompress(base64.b64decode(entry.fr))
                write_private(into / f"{name}.fr.pkl", data)
                try:
                    found.records.append(parse_flight_record(data, rank))
                except DiagnoseError as exc:
                    missing.append(str(exc))
            elif entry.fr_error:
                missing.append(f"rank {rank.rank} on {node.node}: flight recorder: "
                               f"{entry.fr_error}")
    return found


def _still(analyses: list[HangAnalysis], places: list[dict[RankId, tuple]]) -> HangAnalysis:
    """The first sample's analysis, keeping only the suspects every sample names at the
    same place; none when the ranks moved between the samples (the run goes on)."""
    first = analyses[0]
    if len(analyses) == 1:
        return first
    common = [s for s in first.suspects if all(s in a.suspects for a in analyses[1:])]
    moved = sorted({r.rank for p in places[1:] for r in p if p[r] != places[0].get(r)})
    if common == first.suspects and not moved:
        return first
    if not common:
        who = f"rank{'s' if len(moved) > 1 else ''} {', '.join(map(str, moved))}"
        verdict = (f"no suspect: {who} moved between the {len(analyses)} samples, so "
                   "the run makes progress" if moved else
                   f"no suspect: no rank is named in all {len(analyses)} samples")
    else:
        verdict = first.verdict + f" (in all {len(analyses)} samples)"
    return HangAnalysis(common, first.groups, verdict, first.source, first.ranks)


def _fr_place(record: FlightRecord) -> tuple:
    return tuple(record.last(pg)[::2] for pg in sorted(record.status))  # (seq, state)


def analyse(rounds: list[list[NodeDumps]], into: Path,
            timed_out: str | None = None) -> Diagnosis:
    """Keep every rank's dumps under INTO (the first sample as NODE-rankR.json and
    NODE-rankR.fr.pkl, later ones with .sampleN before the suffix), read them, and name
    the suspects that hold still. TIMED_OUT: the dumps are of the ranks that survived
    others' collective timeout (whose: the words), see hang.blame_survivors."""
    private_dir(into)
    missing: list[str] = []
    stacks: list[HangAnalysis] = []
    flights: list[HangAnalysis] = []
    stack_places: list[dict[RankId, tuple]] = []
    flight_places: list[dict[RankId, tuple]] = []
    for i, dumps in enumerate(rounds):  # what could not be dumped: said once, from sample 1
        found = _read_round(dumps, into, f".sample{i + 1}" if i else "",
                            missing if i == 0 else [])
        if found.stacks:
            stacks.append(analyze_stacks(found.stacks))
            stack_places.append({state.rank: (state.collective, state.frame)
                                 for state in map(locate, found.stacks)})
        if found.records:
            flights.append(analyze_flight_records(found.records))
            flight_places.append({r.rank: _fr_place(r) for r in found.records})
    held = _still(stacks, stack_places) if stacks else None
    if held and timed_out:
        held = blame_survivors(held, timed_out)
    diagnosis = Diagnosis(held,
                          _still(flights, flight_places) if flights else None, into, missing)
    write_private(into / "report.txt", diagnosis.report() + "\n")
    write_private(into / "analysis.json", json.dumps(diagnosis.to_json(), indent=2) + "\n")
    return diagnosis


def targets_of(nodes: Iterable[tuple[NodeSpec, str]],
               clients: dict[str, ssh.Connection]) -> list[Target]:
    """The nodes of a run, from their inventory entries and each one's torchrun (the run's
    node command's: py-spy is found beside it)."""
    return [Target(spec.name, clients[spec.name], spec.python, py_spy_for(torchrun))
            for spec, torchrun in nodes]


def read_node_dumps(dumps: dict[str, dict], into: Path, found_by: str) -> dict[str, Any]:
    """What the nodes dumped when they found a run hung (node/supervise.py: per node,
    STATE/hang/<node>.json, its samples of every rank), read as `diagnose` reads its own:
    into INTO, with the suspects named. The run's record of the hang. Each sample is the
    node's `dump` of its workers (DumpAnswer's ranks)."""
    def samples(d: dict) -> list[list[RankDump]]:
        return [DumpAnswer.from_json({"ranks": ranks}).ranks
                for ranks in d.get("samples") or [d.get("ranks") or []]]

    by_node = {n: samples(d) for n, d in sorted(dumps.items())}
    count = max((len(ranks) for ranks in by_node.values()), default=1)
    rounds = [[NodeDumps(name, ranks[i] if i < len(ranks) else [],
                         None if i < len(ranks) and ranks[i] else
                         "no worker of this run ran there")
               for name, ranks in by_node.items()]
              for i in range(count)]
    diagnosis = analyse(rounds, into)
    first = min(dumps.values(), key=lambda d: float(d.get("detected_at", 0)))
    return {"detected_at": iso(float(first.get("detected_at", 0))),
            "quiet_s": first.get("quiet_s"), "found_by": found_by, **diagnosis.to_json()}
