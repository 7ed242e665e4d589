"""Which rank holds up a hung distributed run, and where (pure: no I/O but read_*).

Two kinds of evidence, one dump per rank; the caller says whose (RankId: node, global
rank, pid):

* Python stacks, as `py-spy dump --json --pid PID` prints them (py-spy 0.4): a JSON list
  of threads {pid, thread_id, thread_name, os_thread_id, active, owns_gil, frames,
  process_info}, each frame {name, filename, module, short_filename, line, locals,
  is_entry, is_shim_entry}, innermost first. With --native, C/C++ frames are among them
  (module: the shared library, line 0). analyze_stacks() finds, for each rank, whether it
  is inside a torch.distributed collective (a distributed_c10d.py function, or the C++
  c10d::Work::wait under a user's work.wait() when the dump is --native) and its innermost
  frame of user code, groups the ranks by the two and names the odd ones out.

* PyTorch's flight recorder, as torch 2.13 writes it (torch._C._distributed_c10d.
  _dump_fr_trace, a pickled dict, or _dump_fr_trace_json): per process group the last
  collective sequence number each rank enqueued and completed ("pg_status"), and the
  recent collectives ("entries"). It records for gloo on CPU as for NCCL (on by default,
  TORCH_FR_BUFFER_SIZE entries, 2000). analyze_flight_records() names a rank that is
  behind the others, or that entered a different collective at the same number.

Both give a HangAnalysis: suspects, groups, report() and to_json().
"""

from __future__ import annotations

import io
import json
import pickle
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import DiagnoseError
from ..node.protocol import LIB_SUBDIR, NODE_STATE_DIR

# --- what a frame is ------------------------------------------------------------------

LIBRARY_DIRS = ("/site-packages/", "/dist-packages/")
STDLIB = re.compile(r"/lib(?:64)?/python\d+(?:\.\d+)?t?/")  # /usr/lib/python3.11/, a venv's base
TORCH_DIR = "/torch/"  # torch from a source checkout, outside site-packages
# The worker runner's own frames: the node package on a node (~/.clustertrain/lib/V/...),
# in a checkout, and where earlier versions kept it (the recorded dumps of the tests).
RUNNERS = ("orchestrator/node/worker.py", "orchestrator/node/__main__.py",
           "orchestrator/run_worker.py", f"{NODE_STATE_DIR}/run_worker.py")
LIB_DIR = f"/{NODE_STATE_DIR}/{LIB_SUBDIR}/"
C10D_FILE = "torch/distributed/distributed_c10d.py"
# The torch.distributed calls every rank of a group must make (init and new_group included:
# a rank that never gets there holds up the others as a missing all_reduce would).
COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
    "all_gather_coalesced", "all_gather_object", "_all_gather_base", "broadcast",
    "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "_reduce_scatter_base", "all_to_all", "all_to_all_single", "gather", "gather_object",
    "scatter", "scatter_object_list", "barrier", "monitored_barrier", "send", "recv",
    "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list",
    "init_process_group", "new_group",
})
WAIT = "wait"  # waiting on an async collective's Work (async_op=True, then work.wait())
PY_WAITS = frozenset({"wait", "wait_tensor"})  # Python-side waits under torch/distributed
# c10d::Work::wait, c10d::ProcessGroupNCCL::WorkNCCL::wait, ...
NATIVE_WAIT = re.compile(r"^c10d::(?:\w+::)*\w*Work\w*::wait$")


@dataclass(frozen=True)
class RankId:
    node: str
    rank: int  # global rank
    pid: int   # the worker's pid on its node

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "pid": self.pid}


@dataclass(frozen=True)
class Frame:
    function: str
    filename: str
    line: int
    native: bool = False  # a C/C++ frame (py-spy --native)

    @property
    def where(self) -> str:
        return f"{self.function} ({self.filename.rsplit('/', 1)[-1]}:{self.line})"

    @property
    def is_user(self) -> bool:
        """Code of the job's own: not torch, the standard library, an installed package
        or the project's worker runner."""
        path = self.filename.replace("\\", "/")
        return (not self.native and path.endswith(".py")
                and not any(d in path for d in LIBRARY_DIRS)
                and not STDLIB.search(path) and TORCH_DIR not in f"/{path}"
                and LIB_DIR not in path
                and not any(path == r or path.endswith("/" + r) for r in RUNNERS))

    @property
    def collective(self) -> str | None:
        """The collective this frame is part of, if any ("wait" for Work.wait())."""
        name = self.function.rsplit(".", 1)[-1]
        if self.native:
            return WAIT if NATIVE_WAIT.match(self.function) else None
        path = self.filename.replace("\\", "/")
        if path.endswith(C10D_FILE) and name in COLLECTIVES:
            return name
        if "torch/distributed/" in path or "torch/futures/" in path:
            return WAIT if name in PY_WAITS else None
        return None


def innermost_user_frame(frames: Iterable[Frame]) -> Frame | None:
    return next((f for f in frames if f.is_user), None)


def collective_in(frames: tuple[Frame, ...]) -> str | None:
    """The collective the user's code called: of the collective frames inner to the
    innermost user frame (all frames if there is none), the outermost one (all_gather_object
    over the all_gather it makes, all_reduce over the Work.wait() inside it)."""
    user = next((i for i, f in enumerate(frames) if f.is_user), len(frames))
    found = [c for c in (f.collective for f in frames[:user]) if c]
    return found[-1] if found else None


# --- py-spy dumps ---------------------------------------------------------------------

@dataclass(frozen=True)
class PyThread:
    thread_id: int
    os_thread_id: int | None
    name: str | None
    frames: tuple[Frame, ...]  # innermost first, as py-spy prints them

    def is_main(self, pid: int) -> bool:
        return self.os_thread_id == pid or self.name == "MainThread"


@dataclass(frozen=True)
class RankStacks:
    rank: RankId
    threads: tuple[PyThread, ...]


def _field(obj: Any, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(obj, dict) or key not in obj or not isinstance(obj[key], kind):
        raise DiagnoseError(f"{what} has no {key!r} of the expected type")
    return obj[key]


def _pyspy_frame(raw: Any, what: str) -> Frame:
    return Frame(function=_field(raw, "name", str, what),
                 filename=_field(raw, "filename", str, what),
                 line=_field(raw, "line", int, what),
                 native=isinstance(raw, dict) and raw.get("module") is not None)


def _pyspy_thread(raw: Any, rank: RankId, what: str) -> PyThread:
    pid = raw.get("pid") if isinstance(raw, dict) else None
    if pid is not None and pid != rank.pid:
        raise DiagnoseError(f"{what} is of pid {pid}, but rank {rank.rank} on {rank.node} "
                            f"is pid {rank.pid}: the dump and the rank map do not match")
    frames = _field(raw, "frames", list, what)
    return PyThread(thread_id=_field(raw, "thread_id", int, what),
                    os_thread_id=raw.get("os_thread_id"), name=raw.get("thread_name"),
                    frames=tuple(_pyspy_frame(f, f"{what}, frame {i}")
                                 for i, f in enumerate(frames)))


def parse_pyspy_dump(text: str | bytes, rank: RankId) -> RankStacks:
    """One rank's stacks from what `py-spy dump --json --pid PID` printed."""
    what = f"the py-spy dump of rank {rank.rank} on {rank.node} (pid {rank.pid})"
    if not text.strip():
        raise DiagnoseError(f"{what} is empty: py-spy printed nothing. Run `py-spy dump "
                            f"--json --pid {rank.pid}` on {rank.node} to see why (the "
                            "process gone, or no permission to ptrace it)")
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise DiagnoseError(f"{what} is not JSON ({exc}): was py-spy run with --json?") from None
    if not isinstance(raw, list) or not raw:
        raise DiagnoseError(f"{what} is not a list of threads as py-spy 0.4 prints it")
    threads = tuple(_pyspy_thread(t, rank, f"{what}, thread {i}") for i, t in enumerate(raw))
    return RankStacks(rank, threads)


def read_pyspy_dump(path: Path, rank: RankId) -> RankStacks:
    return parse_pyspy_dump(Path(path).read_text(), rank)


# --- analysis results -----------------------------------------------------------------

@dataclass(frozen=True)
class Suspect:
    node: str
    rank: int
    frame: str | None  # where in the user's code, "function (file.py:line)"
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "frame": self.frame, "why": self.why}


@dataclass(frozen=True)
class Group:
    """Ranks at the same place: in the same collective (None: outside any), called from
    the same user frame; from a flight recorder also the process group, the collective's
    sequence number and its state."""

    ranks: tuple[RankId, ...]
    collective: str | None
    frame: Frame | None
    process_group: int | None = None
    seq: int | None = None
    state: str | None = None

    @property
    def place(self) -> str:
        if self.seq is not None:
            op = self.collective or "(a collective the recorder no longer holds)"
            return (f"#{self.seq} {op}" + (f" ({self.state})" if self.state else "")
                    + f" in process group {self.process_group}"
                    + (f", called from {self.frame.where}" if self.frame else ""))
        if self.collective is None:
            return "outside any collective" + (f", in {self.frame.where}" if self.frame else "")
        op = "wait() on an async collective" if self.collective == WAIT else self.collective
        return f"in {op}" + (f", called from {self.frame.where}" if self.frame else "")

    @property
    def at(self) -> str:
        """The place after a verb: "wait in all_reduce, ...", "wait at #3 all_reduce ..."."""
        return f"at {self.place}" if self.seq is not None else self.place

    def to_json(self) -> dict[str, Any]:
        return {"collective": self.collective, "frame": self.frame.where if self.frame else None,
                "process_group": self.process_group, "seq": self.seq, "state": self.state,
                "ranks": [r.to_json() for r in self.ranks]}


@dataclass
class HangAnalysis:
    suspects: list[Suspect]
    groups: list[Group]
    verdict: str  # one line: who holds the run up, or why nobody is named
    source: str   # "py-spy stacks" or "flight recorder"
    ranks: list[RankId] = field(default_factory=list)

    def report(self) -> str:
        nodes = len({r.node for r in self.ranks})
        lines = [f"Hang analysis from {self.source} of {_count(len(self.ranks), 'rank')} "
                 f"on {_count(nodes, 'node')}: {self.verdict}"]
        lines += [f"  suspect: rank {s.rank} on {s.node} {s.why}" for s in self.suspects]
        lines.append("Where the ranks are:")
        lines += [f"  {_rank_list(g.ranks)} ({_by_node(g.ranks)}): {g.place}" for g in self.groups]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"suspects": [s.to_json() for s in self.suspects],
                "groups": [g.to_json() for g in self.groups]}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _numbers(ns: Iterable[int]) -> str:
    """1, 2, 3, 5 -> "1-3, 5"; runs shorter than three stay listed."""
    ns, parts, i = sorted(ns), [], 0
    while i < len(ns):
        j = i
        while j + 1 < len(ns) and ns[j + 1] == ns[j] + 1:
            j += 1
        parts += [f"{ns[i]}-{ns[j]}"] if j - i >= 2 else [str(n) for n in ns[i:j + 1]]
        i = j + 1
    return ", ".join(parts)


def _rank_list(ranks: Iterable[RankId]) -> str:
    ns = [r.rank for r in ranks]
    return f"{'rank' if len(ns) == 1 else 'ranks'} {_numbers(ns)}"


def _by_node(ranks: Iterable[RankId]) -> str:
    nodes: dict[str, list[int]] = defaultdict(list)
    for r in ranks:
        nodes[r.node].append(r.rank)
    return "; ".join(f"{n}: {_numbers(rs)}" for n, rs in sorted(nodes.items()))


TIE = ("a tie: as many ranks wait in one place as in another, so which side went astray "
       "cannot be told")


def _wait_verb(ranks: tuple[RankId, ...]) -> str:
    return "waits" if len(ranks) == 1 else "wait"


def _others(groups: Iterable[Group]) -> str:
    return "; ".join(f"{_rank_list(g.ranks)} {_wait_verb(g.ranks)} {g.at}" for g in groups)


def _checked_ranks(ranks: Iterable[RankId], what: str) -> list[RankId]:
    ranks = list(ranks)
    if not ranks:
        raise DiagnoseError(f"no {what} to analyse: give one dump per rank of the run")
    seen: dict[int, RankId] = {}
    for r in ranks:
        if r.rank in seen:
            raise DiagnoseError(f"two {what} for rank {r.rank} ({seen[r.rank].node} pid "
                                f"{seen[r.rank].pid} and {r.node} pid {r.pid}): give one per rank")
        seen[r.rank] = r
    return ranks


def _grouped(items: Iterable[tuple[RankId, tuple]]) -> list[Group]:
    """Ranks grouped by key (Group's fields after ranks), biggest group first, then by
    lowest rank."""
    by_key: dict[tuple, list[RankId]] = defaultdict(list)
    for rank, key in items:
        by_key[key].append(rank)
    groups = [Group(tuple(sorted(rs, key=lambda r: r.rank)), *key) for key, rs in by_key.items()]
    return sorted(groups, key=lambda g: (-len(g.ranks), g.ranks[0].rank))


def _odd_ones_out(groups: list[Group]) -> list[Suspect]:
    """Of groups at different places (in different collectives, or the same one from
    different code), the ranks outside the one biggest group; on a tie for biggest,
    every rank, as either side may be the one that went astray."""
    if len(groups) < 2:
        return []
    top = [g for g in groups if len(g.ranks) == len(groups[0].ranks)]
    if len(top) == 1:
        return [Suspect(r.node, r.rank, g.frame.where if g.frame else None,
                        f"waits {g.at}; {_others(top)}")
                for g in groups[1:] for r in g.ranks]
    return [Suspect(r.node, r.rank, g.frame.where if g.frame else None,
                    f"waits {g.at}; {_others(o for o in groups if o is not g)}; {TIE}")
            for g in groups for r in g.ranks]


def _split_verdict(suspects: list[Suspect], total: int, places: str) -> str:
    """The verdict when the ranks wait in different places (the odd ones out named)."""
    if len(suspects) == total:
        return f"the ranks are split evenly between {places}: all are named"
    named = [s.rank for s in suspects]
    verb = "waits" if len(named) == 1 else "wait"
    return (f"{'rank' if len(named) == 1 else 'ranks'} {_numbers(named)} {verb} elsewhere than "
            f"the others: {places}")


# --- stacks analysis ------------------------------------------------------------------

@dataclass(frozen=True)
class RankState:
    rank: RankId
    collective: str | None
    frame: Frame | None   # innermost user frame of the thread that tells
    thread: str | None    # that thread's name


def locate(stacks: RankStacks) -> RankState:
    """Where a rank is: its thread inside a collective (the main thread first), else its
    main thread (os_thread_id == pid, or named MainThread), else its first thread."""
    pid = stacks.rank.pid
    ordered = sorted(enumerate(stacks.threads),
                     key=lambda it: (collective_in(it[1].frames) is None,
                                     not it[1].is_main(pid), it[0]))
    thread = ordered[0][1]
    return RankState(stacks.rank, collective_in(thread.frames),
                     innermost_user_frame(thread.frames), thread.name)


def analyze_stacks(dumps: Iterable[RankStacks]) -> HangAnalysis:
    dumps = list(dumps)
    ranks = sorted(_checked_ranks((d.rank for d in dumps), "py-spy dumps"), key=lambda r: r.rank)
    states = [locate(d) for d in dumps]
    groups = _grouped((s.rank, (s.collective, s.frame)) for s in states)
    waiting = [g for g in groups if g.collective is not None]
    outside = [g for g in groups if g.collective is None]
    source = "py-spy stacks"
    if not waiting:
        return HangAnalysis([], groups, "no suspect: no rank waits in a collective, so none "
                            "waits for another (all run outside collectives)", source, ranks)
    if outside:
        suspects = [Suspect(r.node, r.rank, g.frame.where if g.frame else None,
                            f"is in {g.frame.where if g.frame else 'no code of its own'}, "
                            f"outside any collective; {_others(waiting)}")
                    for g in outside for r in g.ranks]
        named = [r for g in outside for r in g.ranks]
        verdict = (f"{_rank_list(named)} {'is' if len(named) == 1 else 'are'} outside any "
                   "collective while the others wait in one")
        return HangAnalysis(suspects, groups, verdict, source, ranks)
    if len(waiting) == 1:
        return HangAnalysis([], groups, f"no suspect: every rank waits {waiting[0].place}; "
                            "none is behind the others, so look at what they all depend on "
                            "(the network, a peer's node, the backend)", source, ranks)
    suspects = _odd_ones_out(waiting)
    verdict = _split_verdict(suspects, len(ranks), "different collectives or call sites")
    return HangAnalysis(suspects, groups, verdict, source, ranks)


# --- flight recorder ------------------------------------------------------------------

@dataclass(frozen=True)
class FrEntry:
    pg_id: int
    collective_seq_id: int
    profiling_name: str  # "gloo:all_reduce", "nccl:broadcast"
    state: str           # as recorded: scheduled, started or completed
    is_p2p: bool
    frames: tuple[Frame, ...]  # innermost first; the JSON dump has none

    @property
    def op(self) -> str:
        return self.profiling_name.split(":", 1)[-1]


@dataclass(frozen=True)
class PgStatus:
    last_enqueued: int
    last_started: int
    last_completed: int


@dataclass(frozen=True)
class FlightRecord:
    rank: RankId
    version: str
    status: dict[int, PgStatus]  # by process group id
    entries: tuple[FrEntry, ...]

    def last(self, pg_id: int) -> tuple[int, FrEntry | None, str]:
        """The last collective the rank enqueued in a process group: (sequence number, its
        entry if the recorder still holds it, state). gloo records no start/end events,
        so its entries stay "scheduled"; the state here comes from pg_status."""
        st = self.status[pg_id]
        seq = st.last_enqueued
        entry = next((e for e in reversed(self.entries) if e.pg_id == pg_id
                      and not e.is_p2p and e.collective_seq_id == seq), None)
        if seq <= st.last_completed:
            state = "completed"
        elif seq <= st.last_started:
            state = "started"
        else:
            state = entry.state if entry and entry.state != "completed" else "scheduled"
        return seq, entry, state


class _PlainUnpickler(pickle.Unpickler):
    """torch's dump holds only dicts, lists, tuples, strings and numbers: refuse the rest,
    since a dump comes from another machine."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it refers to {module}.{name}; torch's holds only "
                                     "plain values")


def _load_fr(data: bytes, what: str) -> dict:
    if not data.strip():
        raise DiagnoseError(f"{what} is empty: the rank wrote no flight-recorder dump")
    try:
        if data.lstrip()[:1] == b"{":
            raw = json.loads(data)
        else:
            raw = _PlainUnpickler(io.BytesIO(data)).load()
    except (ValueError, pickle.UnpicklingError, EOFError) as exc:
        raise DiagnoseError(f"{what} is neither torch's pickled nor its JSON "
                            f"flight-recorder dump ({exc})") from None
    if not isinstance(raw, dict):
        raise DiagnoseError(f"{what} is not a dict as torch's flight recorder writes it")
    return raw


def _int(v: Any, what: str) -> int:
    try:
        return int(v)  # the JSON dump writes pg_status numbers as strings
    except (TypeError, ValueError):
        raise DiagnoseError(f"{what}: {v!r} is not a number") from None


def _fr_status(raw: dict, what: str) -> dict[int, PgStatus]:
    pgs = raw.get("pg_status")
    if not isinstance(pgs, dict) or not pgs:
        raise DiagnoseError(f"{what} has no pg_status: was the flight recorder on? "
                            "(TORCH_FR_BUFFER_SIZE=0 turns it off)")
    return {_int(pg, f"{what}, pg_status"): PgStatus(
        *(_int(_field(st, k, (int, str), f"{what}, pg_status[{pg}]"),
               f"{what}, pg_status[{pg}][{k!r}]")
          for k in ("last_enqueued_collective", "last_started_collective",
                    "last_completed_collective")))
        for pg, st in pgs.items()}


def _fr_entry(raw: Any, what: str) -> FrEntry:
    frames = (raw.get("frames") or []) if isinstance(raw, dict) else []
    return FrEntry(pg_id=_field(raw, "pg_id", int, what),
                   collective_seq_id=_field(raw, "collective_seq_id", int, what),
                   profiling_name=_field(raw, "profiling_name", str, what),
                   state=_field(raw, "state", str, what),
                   is_p2p=bool(raw.get("is_p2p", False)),
                   frames=tuple(Frame(_field(f, "name", str, what),
                                      _field(f, "filename", str, what),
                                      _field(f, "line", int, what)) for f in frames))


def parse_flight_record(data: bytes, rank: RankId) -> FlightRecord:
    """One rank's flight recorder, from the bytes torch's _dump_fr_trace (pickle) or
    _dump_fr_trace_json wrote."""
    what = f"the flight-recorder dump of rank {rank.rank} on {rank.node}"
    raw = _load_fr(data, what)
    entries = raw.get("entries", [])
    if not isinstance(entries, list):
        raise DiagnoseError(f"{what} has 'entries' that are not a list")
    return FlightRecord(rank, str(raw.get("version", "")), _fr_status(raw, what),
                        tuple(_fr_entry(e, f"{what}, entry {i}") for i, e in enumerate(entries)))


def read_flight_record(path: Path, rank: RankId) -> FlightRecord:
    return parse_flight_record(Path(path).read_bytes(), rank)


def _fr_groups(records: list[FlightRecord], pg: int) -> list[Group]:
    def key(rec: FlightRecord) -> tuple:
        seq, entry, state = rec.last(pg)
        frame = innermost_user_frame(entry.frames) if entry else None
        return (entry.op if entry else None, frame, pg, seq, state)

    return _grouped((r.rank, key(r)) for r in records if pg in r.status)


def _fr_suspects(groups: list[Group]) -> list[Suspect]:
    """A rank whose last collective is behind the others'; else, at the same number,
    one in a different collective than the others."""
    ahead = max(g.seq for g in groups if g.seq is not None)
    front = [g for g in groups if g.seq == ahead]
    behind = [g for g in groups if g.seq != ahead]
    if behind:
        return [Suspect(r.node, r.rank, g.frame.where if g.frame else None,
                        f"is behind: its last collective is {g.place}; "
                        + "; ".join(f"{_rank_list(f.ranks)} got to {f.place}" for f in front))
                for g in behind for r in g.ranks]
    by_op = _grouped((r, (g.collective, None, g.process_group, g.seq, None))
                     for g in front for r in g.ranks)
    call_site = {r.rank: g.frame.where for g in front if g.frame for r in g.ranks}
    return [replace(s, frame=call_site.get(s.rank)) for s in _odd_ones_out(by_op)]


def analyze_flight_records(records: Iterable[FlightRecord]) -> HangAnalysis:
    records = list(records)
    ranks = sorted(_checked_ranks((r.rank for r in records), "flight-recorder dumps"),
                   key=lambda r: r.rank)
    pgs = sorted({pg for r in records for pg in r.status})
    groups = [g for pg in pgs for g in _fr_groups(records, pg)]
    found: dict[int, Suspect] = {}
    for pg in pgs:
        for s in _fr_suspects(_fr_groups(records, pg)):
            found.setdefault(s.rank, s)
    suspects = sorted(found.values(), key=lambda s: s.rank)
    if len(suspects) == len(ranks):
        verdict = _split_verdict(suspects, len(ranks),
                                 "different collectives at one sequence number")
    elif suspects:
        named = [s.rank for s in suspects]
        verdict = f"{_rank_list(s for s in ranks if s.rank in named)} held up the others"
    else:
        verdict = ("no suspect: in every process group all ranks got to the same collective "
                   "(same sequence number and operation)")
    return HangAnalysis(suspects, groups, verdict, "flight recorder", ranks)


def blame_survivors(analysis: HangAnalysis, timed_out: str) -> HangAnalysis:
    """Stacks of the ranks still running after others (TIMED_OUT says whose) timed out
    waiting in a collective: a survivor in its own code, outside any collective, is the
    one they waited for. A rank caught leaving (no frame of user code) is not named."""
    if analysis.suspects:
        return analysis
    suspects = [Suspect(r.node, r.rank, g.frame.where,
                        f"is {g.place}, while {timed_out} timed out waiting in a collective")
                for g in analysis.groups if g.collective is None and g.frame for r in g.ranks]
    if not suspects:
        return analysis
    who = ", ".join(f"rank {s.rank} on {s.node}" for s in suspects)
    verdict = f"{who} held up the others: {timed_out} timed out waiting in a collective"
    return HangAnalysis(suspects, analysis.groups, verdict, analysis.source, analysis.ranks)

