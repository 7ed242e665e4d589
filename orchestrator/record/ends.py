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

from ..node.protocol import FINISHED_MARKER, NO_SPACE_MARKER

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


@dataclass
class NodeEnds:
    """What one node's log says about the ends of its ranks (global rank numbers)."""

    finished: dict[int, int] = field(default_factory=dict)  # rank -> the script's exit code
    failed: dict[int, int] = field(default_factory=dict)    # rank -> torchrun's exit code
    peer_gone: bool = False  # a rank said that a peer went away (PEER_GONE)
    no_space: str | None = None  # the supervisor's NO_SPACE_MARKER line: the full place


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
            if text.startswith(NO_SPACE_MARKER):
                ends.no_space = text[len(NO_SPACE_MARKER):].strip()
            elif RESTART in text:
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


# -- the failing rank's own exception ---------------------------------------------------
TRACEBACK = "Traceback (most recent call last):"
ERROR_LINES = 3   # of its traceback: the last frame (file, line), and the exception


@dataclass(frozen=True)
class RankError:
    """The end of a rank's traceback, as its node's log has it (text without the prefix)."""

    node: str
    rank: int
    lines: tuple[str, ...]


def rank_error(lines: Iterable[str]) -> RankError | None:
    """The failing rank's own exception in a node's log: the last traceback of the rank
    that torchrun's report names (else of the last rank that printed one), its last
    ERROR_LINES lines. torchrun's own traceback (ChildFailedError) is no rank's."""
    log = list(lines)
    open_: dict[tuple[str, int], list[str]] = {}      # (node, rank): a traceback going on
    done: dict[tuple[str, int], tuple[str, ...]] = {}  # ... and each one's last, ended
    for line in log:
        source, text = _text(line.rstrip("\n"))
        if not source.startswith("rank") or not source[4:].isdigit():
            continue
        key = (line.partition(" | ")[0].rsplit("/", 1)[0], int(source[4:]))
        if text.startswith(TRACEBACK):
            open_[key] = []
        elif key in open_ and text.strip(" ^~"):   # (3.11's carets under a frame: not kept)
            open_[key].append(text)
            if text and not text[0].isspace():   # the exception's line ends it
                done.pop(key, None)
                done[key] = tuple(open_.pop(key)[-ERROR_LINES:])
    if not done:
        return None
    ends = scan_log(log)
    named = [k for k in done if k[1] in ends.failed]
    node, rank = (named or list(done))[-1]
    return RankError(node, rank, done[(node, rank)])
