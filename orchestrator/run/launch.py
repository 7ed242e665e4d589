"""Start a run's supervisors on every node in two phases, so that torchrun starts on every
node at once and the launch's own cost is off the run's path.

Phase one (`Launch.start`, which `train` runs before the code sync so that the two
overlap): one SSH session per node runs the node's launch line (NodeCommand.shell): the
node package's supervisor loads and says READY.
Phase two (`Launch.go`): once every node is ready, GO to all of them; each supervisor
detaches (or, a step of the run's Slurm job, goes on in its step), says STARTED and starts
torchrun. Python's start on a node, the better part of
what a launch costs there, is paid in phase one; on two cores shared by 16 nodes it was
also what made the last node start a second after the first.

A launch called off before GO (`cancel`, or this process ending: the sessions' input
ends) starts nothing anywhere.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from dataclasses import dataclass, field

from ..cluster.fanout import each
from ..cluster.inventory import NodeSpec
from ..cluster.ssh import Connection
from ..node.protocol import READY, STARTED, GoWord
from .command import NodeCommand

LAUNCH_TIMEOUT = 60.0   # seconds for every node to be ready, and again to start


@dataclass
class _Session:
    """One node's launch session: the ssh process and what it said so far."""

    node: str
    proc: subprocess.Popen
    buffer: bytes = b""
    said: list[str] = field(default_factory=list)

    def await_word(self, word: str, deadline: float) -> str:
        """The first line that starts with WORD; RuntimeError with the session's last
        words if it ends first (or does not say it by DEADLINE)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\n", 1)
                text = raw.decode(errors="replace").strip()
                if text.startswith(word):
                    return text
                if text:
                    self.said.append(text)
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"no answer within {LAUNCH_TIMEOUT:.0f} s")
            if not select.select([fd], [], [], left)[0]:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                if self.buffer.strip():
                    self.said.append(self.buffer.decode(errors="replace").strip())
                code = self.proc.wait()
                raise RuntimeError(self.said[-1] if self.said else f"exit {code}")
            self.buffer += chunk

    def close(self, wait: float = 10.0) -> None:
        """End the session: its input ends (a supervisor still waiting for GO exits
        without starting anything) and the ssh process is reaped, ended after WAIT
        seconds (at once: 0)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            if not wait:
                self.proc.terminate()
            self.proc.wait(timeout=wait or 10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Launch:
    """A run's launch on its nodes: `start` (phase one), then `go` or `cancel`."""

    def __init__(self, sessions: dict[str, _Session], lasting: bool = False) -> None:
        self._sessions = sessions
        self.lasting = lasting   # a started node's command lasts as long as its supervisor
        self.started: dict[str, int] = {}   # node: its supervisor's PID, once started
        self._ready: dict[str, str] | None = None   # ready() once waited: its failures
        self.ring_ports: dict[str, int] = {}   # node: its supervisor's ring port (READY)

    @classmethod
    def start(cls, nodes: list[tuple[NodeSpec, NodeCommand]], clients: dict[str, Connection],
              slurm_job: str | None = None) -> Launch:
        """Phase one on every node: returns at once; the nodes load meanwhile (the node
        package is there: preflight's probe put it there when it was missing). With
        SLURM_JOB, each supervisor is a step of that job (NodeCommand.shell): its node's
        command (srun) lasts as long as it does, and outlives the session it was started
        by, which is ended once the supervisor has started."""
        sessions = {spec.name: _Session(spec.name, clients[spec.name].popen(
            cmd.shell(slurm_job), stdin=True)) for spec, cmd in nodes}
        return cls(sessions, lasting=slurm_job is not None)

    def ready(self) -> dict[str, str]:
        """Wait until every node is ready; {node: error} for those that will not be (the
        launch is then called off everywhere)."""
        if self._ready is None:
            deadline = time.monotonic() + LAUNCH_TIMEOUT
            def ready(s: _Session) -> None:
                words = s.await_word(READY, deadline).split()
                if len(words) > 1 and words[1].isdigit():
                    self.ring_ports[s.node] = int(words[1])

            result = each(list(self._sessions.values()), ready, lambda s: s.node)
            self._ready = {n: f"could not start the job: {e}"
                           for n, e in result.failed.items()}
            if self._ready:
                self.cancel()
        return self._ready

    def go(self, key: bytes, env: dict[str, str]) -> dict[str, str]:
        """Phase two: once every node is ready, start them all; {node: error} for the
        nodes that could not be started. If a node was not ready, none is started. KEY:
        the run's ring key; ENV: the job's secret variables (both go over each node's SSH
        session's input, nowhere else)."""
        failed = self.ready()
        if failed:
            return failed
        # GO brings every node's ring port (the supervisors' beats find each other without
        # the share) and the key that proves their beats (node/ring.py).
        word = GoWord(key, dict(self.ring_ports), dict(env)).line()
        for session in self._sessions.values():
            assert session.proc.stdin is not None
            try:
                session.proc.stdin.write(word.encode())
                session.proc.stdin.flush()
            except OSError:
                pass  # reported below, with the session's last words
        deadline = time.monotonic() + LAUNCH_TIMEOUT

        def started(s: _Session) -> int:
            pid = int(s.await_word(STARTED, deadline).split()[1])
            self.started[s.node] = pid
            return pid

        done = each(list(self._sessions.values()), started, lambda s: s.node)
        # The started sessions end by themselves (reaped here), or last as long as their
        # supervisor (a Slurm step: ended here, the step goes on).
        for session in self._sessions.values():
            session.close(0 if self.lasting and session.node in self.started else 10)
        return {n: f"could not start the job: {e}" for n, e in done.failed.items()}

    def cancel(self) -> None:
        """Call the launch off where it has not started (idempotent)."""
        for session in self._sessions.values():
            session.close()
