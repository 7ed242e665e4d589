"""Turn a node's output stream into `node/rank | line` lines."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# torchrun writes worker lines as "[rank3]:text" (LOG_PREFIX_TEMPLATE in command.py).
RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:")
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
    """Feed it chunks of bytes as they arrive; get back whole prefixed lines."""

    node: str
    _partial: bytes = field(default=b"", repr=False)

    def feed(self, chunk: bytes) -> list[str]:
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        return [prefix_line(self.node, self._decode(line)) for line in lines]

    def flush(self) -> list[str]:
        if not self._partial:
            return []
        line, self._partial = self._partial, b""
        return [prefix_line(self.node, self._decode(line))]

    @staticmethod
    def _decode(line: bytes) -> str:
        return line.decode("utf-8", errors="replace").rstrip("\r")
