"""Run one job: start torchrun on every node at once over SSH, stream the logs, and tear
the job down everywhere as soon as one node fails, loses its connection, or on Ctrl-C."""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO

from . import ssh
from .command import EXIT_MARKER, NodeCommand
from .inventory import NodeSpec
from .logstream import LineSplitter
from .runs import RunDir
from .teardown import DEFAULT_GRACE, stop_job

LAST_LINES = 30          # any line: torchrun's own error report is about 20 lines
LAST_WORKER_LINES = 10   # lines the training processes printed
WATCH_INTERVAL = 0.5       # seconds between checks that each node's master connection lives


@dataclass
class NodeOutcome:
    node: str
    exit_code: int | None = None     # None: no exit status (connection lost)
    reason: str = "running"          # exited | lost | stopped
    ended: float | None = None
    last_lines: deque = field(default_factory=lambda: deque(maxlen=LAST_LINES))
    last_worker_lines: deque = field(default_factory=lambda: deque(maxlen=LAST_WORKER_LINES))

    @property
    def failed(self) -> bool:
        return self.reason == "lost" or (self.exit_code not in (0, None))


@dataclass
class JobResult:
    outcomes: dict[str, NodeOutcome]
    first_failed: str | None
    interrupted: bool
    started: float
    ended: float

    @property
    def ok(self) -> bool:
        return not self.interrupted and self.first_failed is None and all(
            o.exit_code == 0 for o in self.outcomes.values())


class Job:
    def __init__(self, run: RunDir, nodes: list[tuple[NodeSpec, NodeCommand]],
                 clients: dict[str, ssh.Connection], out: IO[str] = sys.stdout,
                 grace: float = DEFAULT_GRACE) -> None:
        self.rundir = run
        self.nodes = nodes
        self.clients = clients
        self.out = out
        self.grace = grace
        self.events: queue.Queue[tuple[str, str, object]] = queue.Queue()
        self.outcomes = {spec.name: NodeOutcome(spec.name) for spec, _ in nodes}
        self._print_lock = threading.Lock()
        self._done = threading.Event()
        self._stopping: set[str] = set()
        self._stop_threads: list[threading.Thread] = []

    # -- per-node threads -------------------------------------------------------------
    def _pump(self, spec: NodeSpec, cmd: NodeCommand) -> None:
        outcome = self.outcomes[spec.name]
        splitter = LineSplitter(spec.name)
        try:
            proc = self.clients[spec.name].popen(cmd.shell())
        except Exception as exc:  # noqa: BLE001 - any failure to start is this node's failure
            self.events.put(("lost", spec.name, f"could not start the command: {exc}"))
            return
        self.events.put(("started", spec.name, time.time()))
        code: int | None = None
        assert proc.stdout is not None
        with open(self.rundir.log(spec.name), "a", encoding="utf-8") as log:
            while True:
                chunk = proc.stdout.read1(65536)  # type: ignore[attr-defined]
                if not chunk:
                    break
                lines, code = _take_exit_marker(splitter.feed(chunk), code)
                self._emit(log, outcome, lines)
            lines, code = _take_exit_marker(splitter.flush(), code)
            self._emit(log, outcome, lines)
        proc.wait()
        if code is not None:
            self.events.put(("exit", spec.name, code))
        else:
            # The session ended without torchrun's exit status: the connection broke
            # (node down, rebooted, sshd killed, or the network dropped).
            self.events.put(("lost", spec.name, "SSH connection closed without an exit "
                             "status (node down, rebooted, or sshd killed)"))

    def _emit(self, log: IO[str], outcome: NodeOutcome, lines: list[str]) -> None:
        if not lines:
            return
        text = "".join(line + "\n" for line in lines)
        log.write(text)
        log.flush()
        outcome.last_lines.extend(lines)
        outcome.last_worker_lines.extend(line for line in lines if "/rank" in line.split(" | ")[0])
        with self._print_lock:
            self.out.write(text)
            self.out.flush()

    def _watch(self) -> None:
        """A node whose master connection ended (it stopped answering the ServerAlive
        probes, see ssh.py) is lost, whatever its session still shows."""
        reported: set[str] = set()
        while not self._done.wait(WATCH_INTERVAL):
            for name, conn in self.clients.items():
                if name in reported or self.outcomes[name].reason != "running":
                    continue
                if not conn.alive():
                    reported.add(name)
                    self.events.put(("lost", name, "no answer to SSH keepalive for "
                                     f"{ssh.ALIVE_INTERVAL * ssh.ALIVE_COUNT} s"))

    # -- teardown ----------------------------------------------------------------------
    def _stop(self, names: list[str], why: str) -> None:
        todo = [n for n in names if n not in self._stopping
                and self.outcomes[n].reason == "running"]
        if not todo:
            return
        self._stopping.update(todo)
        self._say(f"stopping {', '.join(todo)} ({why}; SIGTERM, SIGKILL after "
                  f"{self.grace:.0f} s)")
        specs = {spec.name: (spec, cmd) for spec, cmd in self.nodes}
        for name in todo:
            spec, cmd = specs[name]
            t = threading.Thread(target=self._stop_one, args=(spec, cmd), daemon=True)
            t.start()
            self._stop_threads.append(t)

    def _stop_one(self, spec: NodeSpec, cmd: NodeCommand) -> None:
        # The job may not have written its pgid yet: retry until it has, or it ended.
        deadline = time.monotonic() + 10
        while True:
            try:
                result = stop_job(self.clients[spec.name], spec.python, cmd.run_id,
                                  self.grace)
            except Exception as exc:  # noqa: BLE001 - reported; keepalive decides the rest
                self._say(f"{spec.name}: could not stop the job: {exc}")
                return
            if result.found or self.outcomes[spec.name].reason != "running" \
                    or time.monotonic() > deadline:
                if result.left:
                    self._say(f"{spec.name}: processes {result.left} survived SIGKILL")
                return
            time.sleep(0.2)

    def _say(self, text: str) -> None:
        with self._print_lock:
            self.out.write(f"[clustertrain] {text}\n")
            self.out.flush()

    # -- main loop ---------------------------------------------------------------------
    def run(self) -> JobResult:
        started = time.time()
        first_failed: str | None = None
        interrupted = False
        running = set(self.outcomes)
        pumps = [threading.Thread(target=self._pump, args=(spec, cmd), daemon=True,
                                  name=f"pump-{spec.name}") for spec, cmd in self.nodes]
        for t in pumps:
            t.start()
        watcher = threading.Thread(target=self._watch, daemon=True)
        watcher.start()
        give_up_at: float | None = None
        previous = self._install_sigint()
        try:
            while running:
                try:
                    kind, name, value = self.events.get(timeout=0.5)
                except queue.Empty:
                    if give_up_at and time.monotonic() > give_up_at:
                        for name in list(running):
                            self._finish(name, None, "lost")
                            running.discard(name)
                    continue
                if kind == "interrupt":
                    interrupted = True
                    self._say("interrupted: stopping the job on every node "
                              "(press Ctrl-C again to leave without waiting)")
                    self._stop(sorted(running), "Ctrl-C")
                    give_up_at = time.monotonic() + self.grace + 20
                    continue
                if kind == "started" or name not in running:
                    continue
                running.discard(name)
                if kind == "exit":
                    code = int(value)  # type: ignore[arg-type]
                    self._finish(name, code, "stopped" if name in self._stopping else "exited")
                    if code != 0 and first_failed is None and not interrupted \
                            and name not in self._stopping:
                        first_failed = name
                        self._say(f"{name}: torchrun exited with code {code}")
                else:
                    self._finish(name, None, "lost")
                    self._say(f"{name}: {value}")
                    if first_failed is None and not interrupted and name not in self._stopping:
                        first_failed = name
                if first_failed and running:
                    self._stop(sorted(running), f"{first_failed} failed")
                    give_up_at = give_up_at or time.monotonic() + self.grace + 20
        finally:
            self._done.set()
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        for t in self._stop_threads:
            t.join(timeout=self.grace + 5)
        return JobResult(self.outcomes, first_failed, interrupted, started, time.time())

    def _install_sigint(self):
        """First Ctrl-C: stop the job everywhere and wait for it; second: leave at once."""
        if threading.current_thread() is not threading.main_thread():
            return None
        pressed = []

        def handler(signum, frame):  # noqa: ARG001
            if pressed:
                raise KeyboardInterrupt
            pressed.append(signum)
            self.events.put(("interrupt", "", None))

        return signal.signal(signal.SIGINT, handler)

    def _finish(self, name: str, code: int | None, reason: str) -> None:
        outcome = self.outcomes[name]
        outcome.exit_code, outcome.reason, outcome.ended = code, reason, time.time()


def _take_exit_marker(lines: list[str], code: int | None) -> tuple[list[str], int | None]:
    """Remove the EXIT_MARKER line (see NodeCommand.shell) and read torchrun's status."""
    kept = []
    for line in lines:
        at = line.find(EXIT_MARKER)
        if at < 0:
            kept.append(line)
            continue
        try:
            code = int(line[at + len(EXIT_MARKER):].split()[0])
        except (IndexError, ValueError):
            pass
        head = line[:at]
        if head and not head.endswith(" | "):  # output that did not end with a newline
            kept.append(head)
    return kept, code


def connect_all(specs: list[NodeSpec]) -> dict[str, ssh.Connection]:
    with ThreadPoolExecutor(max_workers=min(len(specs), 32)) as pool:
        return dict(zip([s.name for s in specs],
                        pool.map(lambda s: ssh.connect(s.name, s.ssh), specs)))
