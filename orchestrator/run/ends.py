"""How each rank of a run ended, read from the nodes' logs (pure: no I/O).

Two kinds of lines tell it. The worker runner (node/worker.py) prints, once its script has
ended and everything the script wrote is flushed,

    [clustertrain] rank R finished: exit code C

and torchrun, when a worker fails, prints a report that names each failed rank:

      rank      : 1 (local_rank: 1)
      exitcode  : -6 (pid: 4242)  (SIGABRT)

A rank that printed its marker with code 0 and is still reported failed died after its
script had finished: in torch's teardown (gloo's threads abort a finished process now
and then), not in the training.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..node.protocol import FINISHED_MARKER, End

MARKER = re.compile("^" + re.escape(FINISHED_MARKER).replace(r"\{rank\}", r"(\d+)")
                    .replace(r"\{code\}", r"(-?\d+)") + r"\s*$")
REPORT_START = re.compile(r"^(Failures:|Root Cause)")
REPORT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
REPORT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
# torchrun's agent, restarting the workers (--max-restarts): what came before is void.
RESTART = "will restart worker group"
# A rank's collective failing because a peer went away (its process died, its node was
# stopped): gloo's and NCCL's words for it. Such a rank's node is not its run's cause.
PEER_GONE = re.compile(r"Connection (?:reset|closed) by peer|remote process exited|"
                       r"ncclRemoteError")
# A rank's collective timing out (gloo's words, NCCL's watchdog's): the rank that held it
# up is among those still running, so they are dumped before they are stopped.
COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting \d+ms for \w+ operation|"
                                r"Watchdog caught collective operation timeout|"
                                r"ran for \d+ milliseconds before timing out")


@dataclass
class NodeEnds:
    """What one node's log says about the ends of its ranks (global rank numbers)."""

    finished: dict[int, int] = field(default_factory=dict)  # rank -> the script's exit code
    failed: dict[int, int] = field(default_factory=dict)    # rank -> torchrun's exit code
    peer_gone: bool = False  # a rank said that a peer went away (PEER_GONE)


def _text(line: str) -> tuple[str, str]:
    """(source, text) of a node-log line `node1/rank3 | text` (source `rank3` or
    `torchrun`); a line without the prefix is its own text, from an unknown source."""
    head, sep, text = line.partition(" | ")
    if sep and "/" in head and " " not in head:
        return head.rsplit("/", 1)[1], text
    return "", line


def scan_log(lines: Iterable[str]) -> NodeEnds:
    ends = NodeEnds()
    in_report, rank = False, None
    for line in lines:
        source, text = _text(line.rstrip("\n"))
        if source != "torchrun":
            m = MARKER.match(text)
            if m:
                ends.finished[int(m.group(1))] = int(m.group(2))
                continue
            if source.startswith("rank") and PEER_GONE.search(text):
                ends.peer_gone = True
        if source == "" or source == "torchrun":
            if RESTART in text:
                ends = NodeEnds()
                in_report, rank = False, None
            elif REPORT_START.match(text):
                in_report, rank = True, None
            elif in_report and text.startswith("====="):
                in_report = False
            elif in_report and (m := REPORT_RANK.match(text)):
                rank = int(m.group(1))
            elif in_report and rank is not None and (m := REPORT_EXIT.match(text)):
                ends.failed[rank] = int(m.group(1))
    return ends


def how_it_ended(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return "aborted" if name == "SIGABRT" else f"died of {name}"
    return f"exited with code {code}"


@dataclass(frozen=True)
class NodeEnd:
    """A node's part of the run as the orchestrator saw it."""

    name: str
    nproc: int
    exit_code: int | None        # torchrun's; None: no exit status (connection lost)
    reason: End                  # EXITED, LOST or STOPPED
    ended: float | None = None   # when the orchestrator saw it end (time.time())


@dataclass(frozen=True)
class Verdict:
    training_completed: bool | None  # None: not known (no runner, so no markers)
    finished: dict[int, int]         # every rank's marker: rank -> the script's exit code
    after_finish: dict[str, list[str]]  # node -> how its ranks died after they finished
    # node -> rank -> the script's exit code (its marker), or for a rank that never
    # finished, the code torchrun reported for it (negative: the signal that ended it)
    exit_codes: dict[str, dict[int, int]] = field(default_factory=dict)

    def notes(self) -> list[str]:
        return [note for notes in self.after_finish.values() for note in notes]


def judge(nodes: list[NodeEnd], ends: dict[str, NodeEnds], clean_exit: bool) -> Verdict:
    """Did the training complete (every rank's script ended with code 0), and which
    failed nodes failed only after their ranks had finished?"""
    finished: dict[int, int] = {}
    for node in nodes:
        finished.update(ends.get(node.name, NodeEnds()).finished)
    world = sum(n.nproc for n in nodes)
    completed = (all(finished.get(r) == 0 for r in range(world)) if clean_exit
                 else None)
    after: dict[str, list[str]] = {}
    for node in nodes:
        if node.exit_code in (0, None) or node.reason == End.LOST:
            continue
        node_ends = ends.get(node.name, NodeEnds())
        done = {r: c for r, c in node_ends.finished.items() if c == 0}
        if node_ends.failed:
            if all(r in done for r in node_ends.failed):
                after[node.name] = [
                    f"rank {r} on {node.name} finished, then {how_it_ended(c)} in torch's "
                    "teardown" for r, c in sorted(node_ends.failed.items())]
        elif len(done) >= node.nproc:
            # No report names a rank: the node was stopped, or torchrun's output was lost.
            after[node.name] = [
                f"every rank on {node.name} had finished when the node was stopped"
                if node.reason != End.EXITED else f"every rank on {node.name} finished, "
                f"then torchrun {how_it_ended(node.exit_code)}"]
    codes = {node.name: {**ends[node.name].failed, **ends[node.name].finished}
             for node in nodes if node.name in ends}
    return Verdict(completed, finished, after, {n: c for n, c in codes.items() if c})


def root_cause(first: str | None, nodes: list[NodeEnd], ends: dict[str, NodeEnds]) -> str | None:
    """The node a failed run is named after. FIRST, the first node seen failing, unless
    its ranks failed only because a peer went away (gloo's "Connection reset by peer":
    the node whose worker died can take longer to report it than its peers take to fail)
    and another node failed by itself: it was lost, its supervisor failed, or one of its
    ranks ended with a code of its own (a script's error, a worker killed) without losing
    a peer. Then the first of those, by when each ended."""
    if first is None or not ends.get(first, NodeEnds()).peer_gone:
        return first
    stopped = (-signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGINT)
    for node in sorted(nodes, key=lambda n: n.ended if n.ended is not None else float("inf")):
        mine = ends.get(node.name, NodeEnds())
        if node.name == first or mine.peer_gone:
            continue
        codes = {**mine.failed, **mine.finished}.values()
        if node.reason in (End.LOST, End.SUPERVISOR_FAILED) or any(
                c not in (0, *stopped) for c in codes):
            return node.name
    return first
