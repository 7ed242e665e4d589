"""How a run's supervisors are started, watched, cancelled and their logs read: the seam
between the run (lifecycle.py, job.py, settle.py, stop.py) and the way the nodes are
reached. torchx's Scheduler is the model: submit, describe, cancel, log_iter. SSH is the
first implementation (the nodes are reached as Ansible reaches them); Slurm (SlurmScheduler,
for a run that holds a Slurm allocation: `train --queue`) starts the same supervisors as
steps of the run's job, behind the same verbs. `scheduler_for` is the one place that
chooses, from the run.

Whatever the scheduler, each node runs the node package's supervisor (node/supervise.py):
it owns torchrun, keeps the node's state on the share, watches its peers and the hang,
and stops the job when the run must end.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

from ..cluster import nodelib, ssh
from ..cluster.fanout import each
from ..cluster.inventory import NodeSpec
from ..diagnosis.dumps import NodeDumps, collect, targets_of
from ..errors import PreflightError
from ..node import requests as rq
from ..node.answers import StatesAnswer
from ..node.protocol import JOBS_DIR
from .command import NodeCommand
from .launch import Launch
from .secret import RunSecrets

T = TypeVar("T")


@dataclass(frozen=True)
class StopResult:
    node: str
    found: bool            # the node had a job record for this run
    was_running: bool      # some of its processes were alive when the stop began
    killed: list[int]      # PIDs that needed SIGKILL after the grace period
    left: list[int]        # PIDs still alive afterwards (should be empty)
    user: str = ""         # the user the stop ran as on the node
    stale: bool = False    # the recorded group is another process now: nothing signalled


@dataclass
class Submitted(Generic[T]):
    """A submitted run: what was done meanwhile (the code sync), and each node that
    could not be started, with why (then none runs: those that started are stopped)."""
    meanwhile: T
    launch: Launch
    failed: dict[str, str]


class Scheduler(Protocol):
    def submit(self, nodes: list[tuple[NodeSpec, NodeCommand]],
               meanwhile: Callable[[], T], secrets: RunSecrets) -> Submitted[T]:
        """Start the run's supervisors on NODES, all at once, doing MEANWHILE (the code
        sync) while they get ready; SECRETS go to them by a way no other user reads."""
        ...

    def describe(self, nodes: list[tuple[NodeSpec, str]]) -> StatesAnswer:
        """The run's node states and hang dumps (NODES: each node and the run's state
        directory on the share)."""
        ...

    def cancel(self, nodes: list[NodeSpec], run_id: str, grace: float) -> dict[str, StopResult]:
        """Stop the run's processes on NODES (SIGTERM, SIGKILL after GRACE)."""
        ...

    def log_iter(self, node: NodeSpec, cmd: NodeCommand, lease: bool,
                 tail: int | None, from_line: int = 0) -> subprocess.Popen:
        """NODE's log of the run as it grows (its last TAIL lines first, or from line
        FROM_LINE + 1), ending with the exit marker; with LEASE, its standard input
        carries the controller's heartbeat."""
        ...

    def reconnect(self, node: NodeSpec, within: float) -> str | None:
        """A second look at NODE, whose connection dropped: None once it answers again
        (later calls use the new connection), else why not, after WITHIN seconds."""
        ...

    def dump(self, nodes: list[tuple[NodeSpec, NodeCommand]], run_id: str) -> list[NodeDumps]:
        """Every rank's stack and flight recorder on NODES, taken at once (node/dump.py)."""
        ...


class SshScheduler:
    """The nodes over SSH: CLIENTS (open connections, the session's) where given, else a
    connection of its own for each call."""

    def __init__(self, clients: dict[str, ssh.Connection] | None = None) -> None:
        self.clients = clients or {}

    def _conn(self, node: NodeSpec) -> tuple[ssh.Connection, bool]:
        """A connection to NODE, and whether it is this call's own (to close)."""
        if node.name in self.clients:
            return self.clients[node.name], False
        return ssh.connect(node.name, node.ssh), True

    def _launch(self, nodes: list[tuple[NodeSpec, NodeCommand]]) -> Launch:
        """Phase one on NODES: each loads its supervisor, started over SSH."""
        return Launch.start(nodes, self.clients)

    def submit(self, nodes: list[tuple[NodeSpec, NodeCommand]],
               meanwhile: Callable[[], T], secrets: RunSecrets) -> Submitted[T]:
        launch = self._launch(nodes)   # phase one: the nodes load
        try:
            done = meanwhile()
        except BaseException:
            launch.cancel()  # nodes still waiting for the word start nothing
            raise
        failed = launch.go(secrets.key, secrets.env)   # phase two: every node at once
        if failed:  # nothing half-started is left: the nodes that started are stopped
            started = [spec for spec, _ in nodes if spec.name in launch.started
                       and spec.name not in failed]
            self.cancel(started, nodes[0][1].run_id, nodes[0][1].grace)
        return Submitted(done, launch, failed)

    def describe(self, nodes: list[tuple[NodeSpec, str]]) -> StatesAnswer:
        errors = []
        for spec, state_dir in nodes:
            try:
                conn, own = self._conn(spec)
            except Exception as exc:  # noqa: BLE001 - try the next node
                errors.append(str(exc))
                continue
            try:
                return nodelib.ask(conn, spec.python, rq.States(state_dir),
                                   node=spec.name, timeout=30)
            except nodelib.NodeAnswerError as exc:
                errors.append(f"{spec.name}: {exc.said}")
                continue
            except (OSError, TimeoutError, RuntimeError) as exc:
                errors.append(f"{spec.name}: {exc}")
                continue
            finally:
                if own:
                    conn.close()
        raise OSError("no node of the run answered: " + "; ".join(errors))

    def cancel(self, nodes: list[NodeSpec], run_id: str, grace: float) -> dict[str, StopResult]:
        def one(spec: NodeSpec) -> StopResult:
            conn, own = self._conn(spec)
            try:
                return stop_job(conn, spec.python, run_id, grace, node=spec.name)
            finally:
                if own:
                    conn.close()

        return each(nodes, one, lambda s: s.name).values_or_raise()

    def log_iter(self, node: NodeSpec, cmd: NodeCommand, lease: bool,
                 tail: int | None, from_line: int = 0) -> subprocess.Popen:
        return self.clients[node.name].popen(cmd.follow(lease, tail, from_line), stdin=lease)

    def reconnect(self, node: NodeSpec, within: float) -> str | None:
        old = self.clients.get(node.name)
        if old is not None:
            old.close()   # its master ended, or no longer answers
        deadline, why = time.monotonic() + within, "no attempt"
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.clients[node.name] = ssh.connect(
                    node.name, replace(node.ssh, timeout=max(1, round(left))), within=left)
                return None
            except PreflightError as exc:
                why = str(exc)
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        return why

    def dump(self, nodes: list[tuple[NodeSpec, NodeCommand]], run_id: str) -> list[NodeDumps]:
        return collect(targets_of([(spec, cmd.torchrun) for spec, cmd in nodes], self.clients),
                       run_id)


class SlurmScheduler(SshScheduler):
    """A run with a Slurm allocation (`train --queue`): each node's supervisor is a step of
    the run's job JOB (srun, started over the same SSH session and with the same two-phase
    launch as SshScheduler's), so that Slurm tracks, accounts and ends every process of the
    run: `sacct -j JOB` lists a step per node, and `scancel JOB` (or the job's time limit)
    ends them all, each supervisor recording why. The rest (the nodes' states, their logs,
    a stop) is as over SSH."""

    def __init__(self, job: str, clients: dict[str, ssh.Connection] | None = None) -> None:
        super().__init__(clients)
        self.job = job

    def _launch(self, nodes: list[tuple[NodeSpec, NodeCommand]]) -> Launch:
        return Launch.start(nodes, self.clients, slurm_job=self.job)


def scheduler_for(slurm_job: str | None,
                  clients: dict[str, ssh.Connection] | None = None) -> SshScheduler:
    """The scheduler of a run: through Slurm for a run that holds a Slurm job (SLURM_JOB:
    its allocation's, as its record keeps it), else over SSH. CLIENTS: the session's open
    connections, where there are."""
    return SlurmScheduler(slurm_job, clients) if slurm_job else SshScheduler(clients)


def slurm_job_of(info: dict) -> str | None:
    """The Slurm job of a run, from its record (run.json), if it holds one."""
    return (info.get("slurm") or {}).get("job_id") or None


def stop_job(conn: ssh.Connection, python: str, run_id: str, grace: float, *,
             node: str) -> StopResult:
    """Stop run RUN_ID's processes on NODE, behind CONN: the node package's stop
    (node/terminate.py), the one implementation of "stop this run's process tree" for the
    supervisor, train and `stop`; NodeAnswerError (a RuntimeError) when it failed."""
    said = nodelib.ask(conn, python, rq.Stop(JOBS_DIR, run_id, grace), node=node,
                       timeout=grace + 30)
    return StopResult(node, said.found, bool(said.initial), said.killed, said.left, said.user,
                      said.stale)
