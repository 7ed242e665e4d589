"""This node's state file on the share (STATE/<node>.json): what must outlive the node
(its state, its end, its ring port) for the peers and for `runs`. Written when it changes,
and every STATE_REFRESH as a sign of life for whoever reads it without the ring, by a
thread of its own: a share that stalls holds up that thread, never the supervision."""

from __future__ import annotations

import threading
import time

from .protocol import STATE_REFRESH
from .ring import Counters
from .util import write_json


class StateFile:
    def __init__(self, path: str, counters: Counters) -> None:
        self.path, self.counters = path, counters
        self.latest: dict | None = None
        self.final = False
        self.changed = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def put(self, state: dict) -> None:
        """STATE is this node's state from now on: written soon, without waiting here."""
        with self.lock:
            if not self.final:
                self.latest = state
        self.changed.set()

    def close(self, final: dict) -> None:
        """The last state: written, and waited for (as long as the share takes)."""
        with self.lock:
            self.latest, self.final = final, True
        self.changed.set()
        self.thread.join()

    def _loop(self) -> None:
        while True:
            self.changed.wait(STATE_REFRESH)
            self.changed.clear()
            with self.lock:
                state, final = self.latest, self.final
            if state is not None:
                try:
                    write_json(self.path, {**state, "time": time.time()})
                    self.counters.share_writes += 1
                except OSError as exc:   # the share, for a moment: the next change or refresh
                    print(f"{time.strftime('%H:%M:%S')} state not written: {exc}", flush=True)
            if final:
                return   # (the node's end is in its job directory too, and the ring has it)
