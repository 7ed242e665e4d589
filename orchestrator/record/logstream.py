"""Turn a node's output stream into `node/rank | line` lines."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# torchrun writes worker lines as "[rank3]:text" (LOG_PREFIX_TEMPLATE in command.py).
RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:")
# torchrun's tailer reads each worker's log file a line at a time, and a line the worker
# has half written (an unbuffered print writes its pieces one by one) comes out with the
# prefix and no newline; the rest follows with the prefix again. So a prefix can also
# stand inside a line: "[rank2]:sum [rank2]:12\n" is rank 2's "sum 12".
ANY_RANK_PREFIX = re.compile(r"\[rank(\d+)\]:")
# A worker line that starts so is a record for the controller (doctor's results): kept in
# the run's log, not shown on the terminal.
RECORD = "##clustertrain record "


def is_record(line: str) -> bool:
    """Whether a prefixed line (`node/rankN | text`) is a worker's record."""
    head, sep, text = line.partition(" | ")
    return bool(sep) and "/rank" in head and text.startswith(RECORD)


def prefix_line(node: str, line: str) -> str:
    """`node1/rank3 | text` for a worker's line, `node1/torchrun | text` for torchrun's own."""
    m = RANK_PREFIX.match(line)
    if m:
        return f"{node}/rank{m.group(1)} | {line[m.end():]}"
    return f"{node}/torchrun | {line}"


@dataclass
class LineSplitter:
    """Feed it chunks of bytes as they arrive; get back whole prefixed lines, each
    worker's line whole again where torchrun's tailer cut it (ANY_RANK_PREFIX)."""

    node: str
    _partial: bytes = field(default=b"", repr=False)
    _unfinished: dict[str, str] = field(default_factory=dict, repr=False)  # rank: text

    def feed(self, chunk: bytes) -> list[str]:
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        return [out for line in lines for out in self._join(self._decode(line))]

    def drop_partial(self) -> None:
        """Forget the half line received: the stream broke mid-line, and a new one from
        that line on brings it again whole."""
        self._partial = b""

    def flush(self) -> list[str]:
        line, self._partial = self._partial, b""
        out = self._join(self._decode(line)) if line else []
        out += [f"{self.node}/rank{rank} | {text}" for rank, text in self._unfinished.items()]
        self._unfinished.clear()
        return out

    def _join(self, line: str) -> list[str]:
        """The whole lines in one line of torchrun's output: each worker's piece before
        another prefix is the start of a line that a later piece of that rank ends."""
        if not RANK_PREFIX.match(line):
            return [prefix_line(self.node, line)]
        marks = list(ANY_RANK_PREFIX.finditer(line))
        for m, after in zip(marks, marks[1:], strict=False):
            rank = m.group(1)
            self._unfinished[rank] = self._unfinished.get(rank, "") + line[m.end():after.start()]
        last = marks[-1]
        text = self._unfinished.pop(last.group(1), "") + line[last.end():]
        return [f"{self.node}/rank{last.group(1)} | {text}"]

    @staticmethod
    def _decode(line: bytes) -> str:
        return line.decode("utf-8", errors="replace").rstrip("\r")
