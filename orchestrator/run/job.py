"""Run one job: start its supervisor on every node at once over SSH, stream the nodes'
logs, and end the job everywhere as soon as one node fails, loses its connection, or on
Ctrl-C, SIGTERM or SIGHUP.

The nodes supervise the job themselves (node/supervise.py): they stop it when a peer fails
or is lost, and, for an attached run, when this controller's lease ends (it was killed,
its terminal closed, its network dropped). The lease is a heartbeat on the standard
input of each node's follow session: end-of-input gives it up at once.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

from .. import defaults
from ..cluster.inventory import NodeSpec
from ..diagnosis.dumps import analyse, read_node_dumps
from ..node.protocol import (
    COLLECTIVE_TIMEOUT,
    HANG_GATHER,
    HANG_MARKER,
    RECONNECT,
    STOP_MARKER,
    SYSTEM_MARKER,
    End,
)
from ..record.ends import PEER_GONE, rank_error
from ..record.logstream import LineSplitter, is_record
from ..record.progress import Progress, parse_beat
from ..record.rundir import RunDir, iso, open_private
from ..record.system import Sample, SystemWatch, parse_system
from .command import EXIT_MARKER, NodeCommand
from .conclude import JobResult, NodeOutcome
from .scheduler import Scheduler
from .spec import HangWatch, OnHang

STEADY = 5.0             # a stream followed again that breaks sooner is not a blip
HEARTBEAT = 1.0          # seconds between the lease renewals sent to every node
PROGRESS_INTERVAL = 1.0  # seconds between looks at the run's progress (stragglers)
FOUND_BY = "the nodes"   # who found an attached run hung, in its summary
ERROR_TAIL = 256 * 1024  # bytes of a failed node's log read for its rank's traceback


@dataclass(frozen=True)
class Interrupt:
    """Ctrl-C, SIGTERM or SIGHUP, or the output pipe closed: WHY says which."""
    why: str


def reader_gone(out: IO[str], done: threading.Event, look: float = 1.0) -> bool:
    """Whether OUT, a pipe, lost its reader (Linux's poll says POLLERR on a pipe's write
    end once no reader is left) before DONE was set; False at once for anything but a
    pipe (a terminal's end is SIGHUP's)."""
    try:
        fd = out.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
    except (OSError, ValueError, AttributeError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLERR)
    while not done.is_set():
        if any(mask & (select.POLLERR | select.POLLHUP | select.POLLNVAL)
               for _, mask in poller.poll(look * 1000)):
            return True
    return False


@dataclass(frozen=True)
class HangFound:
    """NODE found the run hung and dumped its workers onto the share (its HANG_MARKER)."""
    node: str


@dataclass(frozen=True)
class NodeExited:
    """NODE's part ended, as its exit marker says (take_exit_marker)."""
    node: str
    code: int
    reason: End
    why: str


@dataclass(frozen=True)
class NodeLost:
    """NODE's log could not be followed to its exit marker: WHY."""
    node: str
    why: str


Event = Interrupt | HangFound | NodeExited | NodeLost


@dataclass
class Following:
    """Where following a run stands, between the events its threads send."""
    attached: bool
    running: set[str]                  # the nodes whose part has not ended yet
    next_look: float                   # at the run's progress (monotonic)
    first_failed: str | None = None
    interrupted: bool = False
    why_interrupted: str = ""
    left: bool = False                 # detached on Ctrl-C: stop following now
    give_up_at: float | None = None    # stopped: those not ended by then are lost
    dumped: set[str] = field(default_factory=set)  # nodes that found this hang, dumped
    gather_until: float | None = None  # when to read the dumps of those that did

    def ended(self, name: str) -> bool:
        """NAME's part ends now (False: it had ended already)."""
        if name not in self.running:
            return False
        self.running.discard(name)
        return True


class Job:
    def __init__(self, run: RunDir, nodes: list[tuple[NodeSpec, NodeCommand]],
                 scheduler: Scheduler, out: IO[str] | None = None,
                 grace: float = defaults.GRACE, hang: HangWatch | None = None,
                 gpu_idle: float = defaults.GPU_IDLE) -> None:
        self.rundir = run
        self.nodes = nodes
        self.scheduler = scheduler
        self.out = out if out is not None else sys.stdout  # as it is now (redirect_stdout)
        self.grace = grace
        self.events: queue.Queue[Event] = queue.Queue()
        self.outcomes = {spec.name: NodeOutcome(spec.name) for spec, _ in nodes}
        self._print_lock = threading.Lock()
        self._done = threading.Event()
        self._stopping: set[str] = set()
        self._stop_threads: list[threading.Thread] = []
        self._followers: dict[str, subprocess.Popen] = {}
        self._out_broken = False
        self._log_broken = False
        self.tail: int | None = None   # follow from the last N lines (attach --tail)
        self.watch = hang
        self.progress = Progress(time.monotonic())
        self._hang: dict[str, Any] | None = None
        self._hung = False               # stopped for a hang (--on-hang stop)
        self._hang_open = False          # a hang found and not yet resolved
        self._stragglers: set[str] = set()
        self._stop_echo: set[str] = set()  # nodes whose torchrun now echoes a stop
        self._system_lock = threading.Lock()
        self.system = SystemWatch(gpu_idle)     # the nodes' system metrics: flags
        self._samples: list[Sample] = []        # not yet in the timeline
        self._sampled: dict[str, float] | None = None   # each node's last sample kept

    # -- per-node threads -------------------------------------------------------------
    def _pump(self, spec: NodeSpec, cmd: NodeCommand, lease: bool) -> None:
        """Stream NODE's log until its exit marker. A stream that breaks without it (the
        connection dropped) gets a second look: a new connection, following the log on
        from the line where it broke; the node is lost only if that fails too."""
        outcome = self.outcomes[spec.name]
        splitter = LineSplitter(spec.name)
        tail, seen = self.tail, 0   # lines of the node's log received (from the start
        end: tuple[int, End, str] | None = None   # when TAIL is None)
        again = False               # followed again after a drop
        with open_private(self.rundir.log(spec.name), "a") as log:
            while True:
                try:
                    proc = self.scheduler.log_iter(spec, cmd, lease, tail, seen)
                except Exception as exc:  # noqa: BLE001 - any failure to follow is this node's
                    self.events.put(NodeLost(spec.name, f"could not follow the job: {exc}"))
                    return
                self._followers[spec.name] = proc
                assert proc.stdout is not None
                opened = time.monotonic()
                while chunk := proc.stdout.read1(65536):  # type: ignore[attr-defined]
                    lines = splitter.feed(chunk)
                    seen += sum(1 for line in lines
                                if EXIT_MARKER not in line and HANG_MARKER not in line)
                    lines, end = take_exit_marker(lines, end)
                    lines = self._take_system(spec.name,
                                              self._take_hang_marker(spec.name, lines))
                    if lines:  # the node's own words (a hang's marker is not progress)
                        self.progress.output(time.monotonic())
                    self._emit(log, outcome, lines)
                proc.wait()
                if end is not None or self._done.is_set():
                    break
                # The session ended without torchrun's exit status: the connection broke
                # (no answer to keepalives, node down, rebooted, sshd killed).
                if again and time.monotonic() - opened < STEADY:
                    # Not the network: the node cannot follow its log.
                    self.events.put(NodeLost(spec.name, "its log stream keeps ending "
                                             "without an exit status"))
                    break
                dropped = time.monotonic()
                why = self.scheduler.reconnect(spec, RECONNECT)
                if why is not None:
                    self.events.put(NodeLost(spec.name, "its SSH connection dropped and "
                                             f"a new one failed for {RECONNECT:g} s ({why})"))
                    break
                again = True
                splitter.drop_partial()
                if tail is not None:   # attach --tail: where the log was is not known
                    tail, seen = 0, 0
                self._say(f"{spec.name}: its SSH connection dropped; connected again after "
                          f"{time.monotonic() - dropped:.1f} s, following its log on")
            lines, end = take_exit_marker(splitter.flush(), end)
            self._emit(log, outcome, self._take_system(
                spec.name, self._take_hang_marker(spec.name, lines)))
        if end is not None:
            self.events.put(NodeExited(spec.name, *end))

    def _take_hang_marker(self, node: str, lines: list[str]) -> list[str]:
        """Lines without the node's HANG_MARKER: it found the run hung and dumped its
        workers onto the share (an event for the main loop)."""
        kept, found = take_marker(lines, HANG_MARKER)
        for _ in found:
            self.events.put(HangFound(node))
        return kept

    def _take_system(self, node: str, lines: list[str]) -> list[str]:
        """Lines without the node's system samples (its supervisor's SYSTEM_MARKER lines,
        not the job's output nor its progress): kept for the timeline (but those it has
        already: `attach` again follows the node's log from its start), and a flag they
        raise said once."""
        kept, found = take_marker(lines, SYSTEM_MARKER)
        for text in found:
            sample = parse_system(node, text)
            if sample is None:
                continue
            with self._system_lock:
                if self._sampled is None:
                    self._sampled = {}
                    for s in self.rundir.read_timeline(Sample.from_json):
                        self._sampled[s.node] = max(s.t, self._sampled.get(s.node, s.t))
                if sample.t <= self._sampled.get(node, float("-inf")):
                    continue
                self._sampled[node] = sample.t
                self._samples.append(sample)
                flags = self.system.feed(sample)
            for flag in flags:
                self._say(flag.message)
        return kept

    def _emit(self, log: IO[str], outcome: NodeOutcome, lines: list[str]) -> None:
        """LINES of OUTCOME's node into the run's log and onto the terminal; not onto the
        terminal: a rank's beats and records, and what torchrun says once the node's
        processes were told to stop (its SignalException traceback: the stop's echo, which
        the tool's own lines account for)."""
        now = time.monotonic()
        shown, echo = [], []
        for line in lines:  # every rank's line is progress; its beats are not shown
            head, sep, text = line.partition(" | ")
            torchrun = head.endswith("/torchrun")   # the node's stop writes there, not a rank
            if sep and torchrun and text.startswith(STOP_MARKER):
                self._stop_echo.add(outcome.node)
                continue
            node, slash, rank = head.partition("/rank")
            if not (sep and slash and rank.isdigit()
                    and self.progress.line(node, int(rank), text, now)):
                shown.append(line)
                echo.append(torchrun and outcome.node in self._stop_echo)
        if not shown:
            return
        text = "".join(line + "\n" for line in shown)   # the log keeps records
        lines = [line for line in shown if not is_record(line)]
        said = [line for line, quiet in zip(shown, echo, strict=True)
                if not quiet and not is_record(line)]
        outcome.last_lines.extend(lines)
        outcome.last_worker_lines.extend(line for line in lines if "/rank" in line.split(" | ")[0])
        try:
            log.write(text)
            log.flush()
        except OSError as exc:  # disk full under runs/: keep streaming, say it once
            if not self._log_broken:
                self._log_broken = True
                print(f"[clustertrain] warning: cannot write the run's log ({exc}); the "
                      "nodes keep their own copy (logs RUN fetches it)", file=sys.stderr)
        with self._print_lock:
            if self._out_broken or not said:
                return
            try:
                self.out.write("".join(line + "\n" for line in said))
                self.out.flush()
            except (BrokenPipeError, OSError, ValueError):
                # `train | head`: nobody reads any more. Stop the job rather than hang.
                self._out_broken = True
                self.events.put(Interrupt("the output pipe was closed"))

    def _heartbeat(self) -> None:
        while not self._done.wait(HEARTBEAT):
            for proc in list(self._followers.values()):
                if proc.stdin is None or proc.poll() is not None:
                    continue
                try:
                    proc.stdin.write(b".")
                    proc.stdin.flush()
                except OSError:
                    pass

    def _watch_reader(self) -> None:
        """`train | head`: once the reader of a piped output has left, stop the job, even
        while the job says nothing (a write would find out only at its next line, which
        a quiet job may never print)."""
        if reader_gone(self.out, self._done):
            with self._print_lock:
                self._out_broken = True
            self.events.put(Interrupt("the output pipe was closed"))

    # -- teardown ----------------------------------------------------------------------
    def _stop(self, names: list[str], why: str) -> None:
        todo = [n for n in names if n not in self._stopping
                and self.outcomes[n].reason == End.RUNNING]
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
        try:
            result = self.scheduler.cancel([spec], cmd.run_id, self.grace)[spec.name]
        except Exception as exc:  # noqa: BLE001 - reported; the supervisor decides the rest
            self._say(f"{spec.name}: could not stop the job: {exc}")
            return
        if result.left:
            self._say(f"{spec.name}: processes {result.left} survived SIGKILL")

    def _say(self, text: str) -> None:
        with self._print_lock:
            if self._out_broken:
                return
            try:
                self.out.write(f"[clustertrain] {text}\n")
                self.out.flush()
            except (BrokenPipeError, OSError, ValueError):
                self._out_broken = True

    # -- main loop ---------------------------------------------------------------------
    def run(self, attached: bool = True) -> JobResult:
        """Follow every node until its part ended (launch() first, for a new run). With
        ATTACHED, this process holds the run's lease and stops the job on Ctrl-C,
        SIGTERM, SIGHUP or a closed output; without, Ctrl-C only stops following."""
        started = time.time()
        f = Following(attached, set(self.outcomes), time.monotonic() + PROGRESS_INTERVAL)
        for spec, cmd in self.nodes:
            threading.Thread(target=self._pump, args=(spec, cmd, attached), daemon=True,
                             name=f"pump-{spec.name}").start()
        if attached:
            threading.Thread(target=self._heartbeat, daemon=True).start()
            threading.Thread(target=self._watch_reader, daemon=True).start()
        previous = self._install_signals()
        try:
            while f.running and not f.left:
                self._between_events(f)
                try:
                    event = self.events.get(timeout=0.5)
                except queue.Empty:
                    self._give_up_if_due(f)
                    continue
                match event:
                    case Interrupt():
                        self._on_interrupt(f, event)
                    case HangFound():
                        self._on_hang(f, event)
                    case NodeExited():
                        self._on_exit(f, event)
                    case NodeLost():
                        self._on_lost(f, event)
        finally:
            self._done.set()
            self._close_followers(attached)
            self._restore_signals(previous)
        return self._result(f, started)

    def _between_events(self, f: Following) -> None:
        """Look at the run's progress now and then (not once it is ending), and read a
        hang's dumps once every node that found it dumped (or HANG_GATHER passed)."""
        now = time.monotonic()
        if now >= f.next_look and not f.interrupted and not f.first_failed:
            f.next_look = now + PROGRESS_INTERVAL
            self._look_at_progress()
        if f.gather_until and (time.monotonic() > f.gather_until
                               or not (f.running - f.dumped)):
            f.gather_until = None
            self._read_hang(sorted(f.dumped))
            if self.watch and self.watch.on_hang == OnHang.STOP:
                f.give_up_at = f.give_up_at or time.monotonic() + HANG_GATHER + \
                    self.grace + 20

    def _give_up_if_due(self, f: Following) -> None:
        """Stopped, and the nodes still running did not say they ended in time: lost."""
        if f.give_up_at and time.monotonic() > f.give_up_at:
            for name in list(f.running):
                self._finish(name, None, End.LOST)
                f.running.discard(name)

    def _on_interrupt(self, f: Following, event: Interrupt) -> None:
        if f.interrupted:
            return
        f.interrupted, f.why_interrupted = True, event.why or "Ctrl-C"
        if not f.attached:
            self._say("detached: the run goes on; follow it again with "
                      f"`attach {self.rundir.run_id}`, stop it with "
                      f"`stop {self.rundir.run_id}`")
            f.left = True
            return
        self._say(f"interrupted ({f.why_interrupted}): stopping the job on every "
                  "node (press Ctrl-C again to leave without waiting)")
        self._stop(sorted(f.running), f.why_interrupted)
        f.give_up_at = time.monotonic() + self.grace + 20

    def _on_hang(self, f: Following, event: HangFound) -> None:
        if not f.dumped and not self._hang_open:
            self._hang_open = True
            quiet = self.progress.quiet_for(time.monotonic())
            timeout = self.watch.timeout if self.watch else 0
            self._say(f"hung: the run printed nothing (no line, no beat) for "
                      f"{quiet:.0f} s (--hang-timeout {timeout:g}); every node "
                      "dumps its ranks' stacks")
            f.gather_until = time.monotonic() + HANG_GATHER
        f.dumped.add(event.node)

    def _on_exit(self, f: Following, event: NodeExited) -> None:
        name, code, reason = event.node, event.code, event.reason
        if not f.ended(name):
            return
        if not reason.caused_elsewhere and name in self._stopping:
            reason = End.STOPPED   # this controller stopped it
        # As the node said it: the summary keeps why it was stopped (status.py).
        self._finish(name, code, reason, event.why)
        if reason == End.HUNG:
            self._hung = self._hung or (self.watch is not None
                                        and self.watch.on_hang == OnHang.STOP)
        if code != 0 and f.first_failed is None and not f.interrupted \
                and not reason.caused_elsewhere:
            f.first_failed = name
            lines = self.outcomes[name].last_worker_lines
            lost_peer = any(PEER_GONE.search(line) for line in lines)
            self._say(f"{name}: its clustertrain supervisor failed"
                      if reason == End.SUPERVISOR_FAILED
                      else f"{name}: torchrun exited with code {code}" + (
                          " (its ranks lost a peer: the cause is likely on "
                          "another node)" if lost_peer else ""))
            if f.running and any(COLLECTIVE_TIMEOUT.search(x) for x in lines):
                self._diagnose_timeout(sorted(f.running), name)
        self._stop_the_rest(f)

    def _on_lost(self, f: Following, event: NodeLost) -> None:
        name = event.node
        if not f.ended(name):
            return
        self._finish(name, None, End.LOST, event.why)
        self._say(f"{name}: {event.why}")
        if f.first_failed is None and not f.interrupted and name not in self._stopping:
            f.first_failed = name
        self._stop_the_rest(f)

    def _stop_the_rest(self, f: Following) -> None:
        """A node failed first (attached): the job stops on the nodes still running."""
        if f.first_failed and f.running and f.attached:
            self._stop(sorted(f.running), f"{f.first_failed} failed")
            f.give_up_at = f.give_up_at or time.monotonic() + self.grace + 20

    def _close_followers(self, attached: bool) -> None:
        """End every follow session's input (the lease, when ATTACHED); detached, end
        the sessions too."""
        for proc in self._followers.values():
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
            if not attached and proc.poll() is None:
                proc.terminate()

    def _result(self, f: Following, started: float) -> JobResult:
        """What following found, once the stops asked for are done (a hang's dumps read
        if the nodes ended it before their word came)."""
        for t in self._stop_threads:
            t.join(timeout=self.grace + 5)
        hung = [n for n, o in self.outcomes.items() if o.reason == End.HUNG]
        if hung and self._hang is None:  # the nodes ended it before their word came
            self._read_hang(hung)
        self._say_stragglers(None)   # closes the last windows: one may name a node first
        progress = self.progress.to_json()
        self._keep_timeline()
        with self._system_lock:
            flags = [flag.to_json() for flag in self.system.flags]
        if f.first_failed and not f.interrupted:
            self._say_rank_error(f.first_failed)
        return JobResult(self.outcomes, f.first_failed, f.interrupted, started, time.time(),
                         f.why_interrupted, self._hang, self._hung, progress, flags)

    def _say_rank_error(self, node: str) -> None:
        """The run's last words: the end of the traceback of NODE's failing rank (after
        torchrun's report, which the node printed before it ended), read from the end of
        its log."""
        try:
            with open(self.rundir.log(node), "rb") as log:
                start = max(0, log.seek(0, 2) - ERROR_TAIL)
                log.seek(start)
                tail = log.read().decode(errors="replace").splitlines()[1 if start else 0:]
        except OSError:
            return
        found = rank_error(tail)
        if found is not None:
            self._say(f"{found.node}: rank {found.rank} failed; the end of its traceback:\n"
                      + "\n".join(f"    {found.node}/rank{found.rank} | {line}"
                                  for line in found.lines))

    # -- progress: stragglers and hangs ---------------------------------------------------
    def _look_at_progress(self) -> None:
        """Say which nodes straggle, and when a hang the nodes found ends (--on-hang
        wait: the run printed again)."""
        self._say_stragglers(time.monotonic())
        self._keep_timeline()
        watch = self.watch
        if self._hang_open and watch is not None and \
                self.progress.quiet_for(time.monotonic()) < watch.timeout:
            self._hang_open = False
            self._say("the run makes progress again")

    def _say_stragglers(self, now: float | None) -> None:
        """Each straggler once, when the windows closed by NOW (all of them: None, at the
        end) first name it."""
        for s in self.progress.stragglers(now):
            if s.node not in self._stragglers:
                self._stragglers.add(s.node)
                self._say(s.message())

    def _keep_timeline(self) -> None:
        """Append the windows closed since the last look, and the nodes' system samples
        come since, to the run's timeline.jsonl."""
        with self._system_lock:
            samples, self._samples = self._samples, []
        try:
            self.rundir.append_timeline([*self.progress.take_points(), *samples])
        except OSError as exc:
            if not self._log_broken:
                self._log_broken = True
                self._say(f"cannot write in {self.rundir.path}/ ({exc.strerror}): the "
                          "run goes on; its record there is incomplete")

    def _read_hang(self, dumped: list[str]) -> None:
        """The nodes found the run hung (no node printed anything for --hang-timeout) and
        dumped their workers onto the share: read every node's dumps through any node
        that answers, name who holds the run up, and keep it for the record. With
        --on-hang stop, the nodes stop the run themselves once all of them dumped."""
        quiet = self.progress.quiet_for(time.monotonic())
        try:
            dumps = self.scheduler.describe([(s, c.run_state) for s, c in self.nodes]).hang
        except (OSError, ValueError, KeyError) as exc:
            self._say(f"hang: the nodes' dumps could not be read: {exc}")
            dumps = {}
        if not dumps:
            self._hang = {"detected_at": iso(time.time()), "quiet_s": round(quiet, 1),
                          "found_by": FOUND_BY, "suspects": [], "dumps": str(
                              self.rundir.path / "hang"),
                          "verdict": f"the dumps of {', '.join(dumped)} could not be read "
                          "from the share"}
            self._say(f"hang: {self._hang['verdict']}")
        else:
            self._hang = read_node_dumps(dumps, self.rundir.path / "hang", FOUND_BY)
            diagnosis_lines = (self.rundir.path / "hang" / "report.txt").read_text()
            for line in diagnosis_lines.splitlines():
                self._say(line)
        if self.watch is not None and self.watch.on_hang == OnHang.WAIT:
            self._say("--on-hang wait: the run goes on; watching it still")
        else:
            self._hung = True

    def _diagnose_timeout(self, running: list[str], failed: str) -> None:
        """A rank on FAILED timed out waiting in a collective: the rank it waited for is
        among those still running, so dump them (once) before they are stopped."""
        if self._hang is not None:
            return
        self._say(f"{failed}: a collective timed out; dumping the ranks still running "
                  f"({', '.join(running)}) before stopping them")
        survivors = [(spec, cmd) for spec, cmd in self.nodes if spec.name in running]
        detected = time.time()
        diagnosis = analyse([self.scheduler.dump(survivors, self.rundir.run_id)],
                            self.rundir.path / "hang", timed_out=f"{failed}'s ranks")
        self._hang = {"detected_at": iso(detected), "trigger": f"collective timeout on {failed}",
                      **diagnosis.to_json()}
        for line in diagnosis.report().splitlines():
            self._say(line)

    def _install_signals(self) -> dict:
        """First Ctrl-C (or SIGTERM, SIGHUP): stop the job everywhere and wait for it;
        a second Ctrl-C: leave at once (the nodes still stop it: the lease ends)."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        pressed: list[int] = []
        names = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}

        def handler(signum, frame):  # noqa: ARG001
            if pressed and signum == signal.SIGINT:
                raise KeyboardInterrupt
            pressed.append(signum)
            self.events.put(Interrupt(names.get(signum, str(signum))))

        return {sig: signal.signal(sig, handler) for sig in names}

    @staticmethod
    def _restore_signals(previous: dict) -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    def _finish(self, name: str, code: int | None, reason: End, why: str = "") -> None:
        outcome = self.outcomes[name]
        outcome.exit_code, outcome.reason, outcome.ended = code, reason, time.time()
        outcome.why = why


def whole_log(node: str, output: bytes) -> list[str]:
    """A node's whole OUTPUT of a run that has ended (its follow session's), as following
    it keeps it in the run's log: prefixed lines, without the session's markers, the
    node's system samples or the ranks' beats."""
    splitter = LineSplitter(node)
    lines = splitter.feed(output) + splitter.flush()
    for marker in (EXIT_MARKER, HANG_MARKER, SYSTEM_MARKER):
        lines, _ = take_marker(lines, marker)
    return [line for line in lines if not _not_kept(line)]


def _not_kept(line: str) -> bool:
    """A rank's beat, or the node's word that it was told to stop (Job._emit)."""
    head, sep, text = line.partition(" | ")
    if head.endswith("/torchrun"):
        return bool(sep) and text.startswith(STOP_MARKER)
    return bool(sep) and "/rank" in head and parse_beat(text) is not None


def take_marker(lines: list[str], marker: str) -> tuple[list[str], list[str]]:
    """The lines without `marker`, and the words after each marker found. A marker in
    the middle of a line follows output that did not end with a newline: that output
    is kept."""
    kept, found = [], []
    for line in lines:
        at = line.find(marker)
        if at < 0:
            kept.append(line)
            continue
        found.append(line[at + len(marker):])
        head = line[:at]
        if head and not head.endswith(" | "):
            kept.append(head)
    return kept, found


def take_exit_marker(lines: list[str], end: tuple[int, End, str] | None
                     ) -> tuple[list[str], tuple[int, End, str] | None]:
    """Remove the EXIT_MARKER line that ends a node's follow session and read it:
    (torchrun's exit code, how the node's part ended, why: the rest of the line, words
    and all)."""
    kept, found = take_marker(lines, EXIT_MARKER)
    for rest in found:
        words = rest.split(None, 2)
        try:
            end = (int(words[0]), End(words[1]) if len(words) > 1 else End.EXITED,
                   words[2].strip() if len(words) > 2 and words[2].strip() != "-" else "")
        except (IndexError, ValueError):
            pass
    return kept, end
