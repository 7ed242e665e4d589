"""A run through Slurm's queue (`train --queue`): one allocation of N nodes x G GPUs,
held for the run's whole life by one SSH command on a cluster node (the node package's
`allocate`, node/allocate.py), and given back when `train` ends, however it ends.

While the job waits, one line says where it stands (its place, Slurm's reason in words,
who holds the GPUs); once granted, the run is the same run as without Slurm on the nodes
Slurm chose, each node's ranks seeing only the GPUs Slurm gave it (CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..cluster import nodelib, ssh
from ..cluster.inventory import Cluster
from ..cluster.slurm import limit_words, waiting_line
from ..errors import ClusterError, LaunchError, QueueLimitError
from ..node import requests as rq
from ..node.allocate import END, KEEP
from ..node.protocol import STOP_REQUESTED
from ..node.slurmjob import JOB_ENV
from ..record.rundir import RunDir, iso, write_private
from ..record.status import cut_short
from ..record.summary import RunStatus, Summary
from .conclude import write_summary
from .spec import RunSpec

RELEASE_WAIT = 15.0   # seconds for the node to cancel the job once train lets go


@dataclass(frozen=True)
class AllocationRequest:
    nodes: int | None = None                 # any N nodes of the partition
    hosts: tuple[str, ...] | None = None     # exactly these
    gpus_per_node: int | None = None         # None: every GPU of a node
    partition: str | None = None
    time: str | None = None
    qos: str | None = None

    def node_request(self, name: str) -> rq.Allocate:
        """The node verb `allocate` that holds this allocation as the Slurm job NAME."""
        return rq.Allocate(name=name, gpus_per_node="all" if self.gpus_per_node is None
                           else str(self.gpus_per_node), rest=tuple(self.salloc_args()))

    def salloc_args(self) -> list[str]:
        """salloc's options of the allocation (the GPUs are the node verb's: gres)."""
        args = ["-N", str(len(self.hosts) if self.hosts else self.nodes or 1)]
        if self.hosts:
            args += ["-w", ",".join(self.hosts)]
        for flag, value in (("--partition", self.partition), ("--time", self.time),
                            ("--qos", self.qos)):
            if value:
                args.append(f"{flag}={value}")
        return args


@dataclass
class Allocation:
    job_id: str
    nodes: list[str]                         # Slurm's choice, in inventory order
    gpus: dict[str, list[int]]               # node -> the GPU indices it was given
    waited_s: float
    proc: subprocess.Popen | None = field(default=None, repr=False)
    conn: ssh.Connection | None = field(default=None, repr=False)

    def env(self, node: str) -> dict[str, str]:
        """What NODE's ranks are told: only the GPUs Slurm gave the run."""
        gpus = self.gpus.get(node)
        extra = {"SLURM_JOB_ID": self.job_id, JOB_ENV: self.job_id}
        if gpus:
            extra["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        return extra

    @property
    def gpus_per_node(self) -> int | None:
        """One rank per GPU given (the same number on every node), or None without GPUs."""
        counts = {len(g) for g in self.gpus.values()}
        return counts.pop() if len(counts) == 1 and 0 not in counts else None

    def describe(self) -> str:
        return ", ".join(f"{n} (GPUs {','.join(map(str, self.gpus[n]))})" if self.gpus.get(n)
                         else n for n in self.nodes)

    def record(self) -> dict:
        return {"job_id": self.job_id, "nodes": self.nodes, "gpus": self.gpus,
                "waited_s": round(self.waited_s, 1)}

    def keep(self) -> None:
        """Leave the job to the run (`--detach`): the node's command ends without cancelling
        it, and the run's supervisors cancel it when the run ends (node/slurmjob.py)."""
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(f"{KEEP}\n".encode())
                self.proc.stdin.flush()
            except OSError:
                pass   # the command is gone already, and so is the job: release() says so
        self.release()

    def end(self, status: RunStatus | None) -> None:
        """Say how the run ended (its summary's STATUS) before the allocation is given
        back: its job then ends as the run did, COMPLETED or FAILED in Slurm's accounting
        (node/allocate.py END); a run stopped, or with no summary, has its job cancelled."""
        code = {RunStatus.SUCCEEDED: 0, RunStatus.FAILED: 1, RunStatus.HUNG: 1}.get(
            status) if status is not None else None
        if code is not None and self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(f"{END} {code}\n".encode())
                self.proc.stdin.flush()
            except OSError:
                pass   # the command is gone already, and so is the job

    def release(self) -> None:
        """Give the allocation back: the node cancels the job when its input ends."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
            try:
                proc.wait(timeout=RELEASE_WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def allocate(cluster: Cluster, request: AllocationRequest, run_id: str,
             say: Callable[[str], None] = print) -> Allocation:
    """Ask Slurm for the run's allocation from the cluster's first node, and wait for it
    (saying where it stands whenever that changes). KeyboardInterrupt while waiting, or a
    refusal, cancels the request before it is raised."""
    first = cluster.nodes[0]
    conn = ssh.connect(first.name, first.ssh)
    proc: subprocess.Popen | None = None
    started = time.monotonic()
    try:
        proc, lines = _allocate_on(conn, first.python, request.node_request(job_name(run_id)))
        said = ""
        for raw in lines:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if event["event"] == "pending":
                text = waiting_line(event, time.monotonic() - started)
                words = text.split(": ", 1)[-1]
                if words != said:
                    say(f"run {run_id}: {text}")
                    said = words
            elif event["event"] == "granted":
                order = [n for n in cluster.names if n in event["nodes"]]
                unknown = [n for n in event["nodes"] if n not in cluster.names]
                if unknown:
                    raise LaunchError(
                        f"Slurm gave job {event['job']} nodes the inventory does not list: "
                        f"{', '.join(unknown)}; list every Slurm node in train_nodes, or "
                        "choose them with --hosts")
                return Allocation(event["job"], order, event.get("gpus") or {},
                                  time.monotonic() - started, proc, conn)
            elif event["event"] == "over-limit":
                raise QueueLimitError(limit_words(event))
            elif event["event"] == "refused":
                raise LaunchError("Slurm refused the allocation: "
                                  + " ".join(event.get("said") or [])
                                  + ". Nothing was started")
        raise LaunchError(f"{first.name}: the allocation ended before it was granted "
                          f"(exit {proc.wait()})")
    except BaseException:
        Allocation("", [], {}, 0.0, proc, conn).release()
        raise


def _allocate_on(conn: nodelib.Starts, python: str, request: rq.Allocate
                 ) -> tuple[subprocess.Popen, Iterator[bytes]]:
    """The node verb `allocate` started on CONN's node, and its output's lines. The node
    package is copied first only when the node says it lacks it (the verb's first answer:
    no round trip of its own before every allocation)."""
    copied = False
    while True:
        proc = conn.popen(nodelib.command(python, request), stdin=True)
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if first or copied or proc.wait() != nodelib.MISSING:
            return proc, itertools.chain([first], proc.stdout)
        nodelib.install(conn, python)
        copied = True


def job_name(run_id: str) -> str:
    return f"clustertrain-{run_id}"


def queue_for(spec: RunSpec, whole: Cluster, count: int, run_id: str) -> Allocation:
    """The allocation of a --queue run, from WHOLE's nodes (COUNT of them, or spec.hosts).
    While it waits, the run's record says so (`runs` lists it as queued, `stop` cancels
    it); a run that never gets its nodes gets its summary: interrupted (Ctrl-C), stopped
    (`stop`) or failed (Slurm refused, or QueueLimitError: a limit it could never be
    within, checked before anything is submitted), and nothing stays in the queue."""
    run = RunDir(spec.runs_dir, run_id)
    info = {"run_id": run_id, "inventory": str(whole.inventory.resolve()), "nodes": [],
            "users": {}, "script": spec.script, "script_args": list(spec.script_args),
            "spec": spec.to_file(),
            "queued": {"host": socket.gethostname(), "pid": os.getpid(),
                       "since": iso(time.time())}}
    run.create(info)
    started = time.time()
    try:
        with hangup_interrupts():
            return allocate(whole, AllocationRequest(count, spec.hosts, spec.gpus_per_node,
                                                     spec.partition, spec.time, spec.qos),
                            run_id)
    except BaseException as exc:
        stopped = (run.path / STOP_REQUESTED).exists()
        interrupted = isinstance(exc, KeyboardInterrupt)
        status = (RunStatus.STOPPED if stopped else
                  RunStatus.INTERRUPTED if interrupted else RunStatus.FAILED)
        why = ("stopped while queued (`stop`): its Slurm job was cancelled" if stopped else
               f"{str(exc) or 'Ctrl-C'} while queued: its Slurm job was cancelled" if interrupted
               else str(exc) or repr(exc))
        write_summary(run, cut_short(info, status, started, why))
        if stopped:
            raise LaunchError(f"run {run_id} was stopped while queued (`stop`); its Slurm job "
                              "was cancelled and nothing ran") from None
        raise


@contextmanager
def hangup_interrupts() -> Iterator[None]:
    """While a run waits in the queue (or a sweep runs), SIGHUP (a closed terminal) and
    SIGTERM end the wait as Ctrl-C does: KeyboardInterrupt('SIGHUP'), so that the job is
    cancelled and the record says interrupted (not settled later as a lost controller).
    Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {s: signal.signal(s, interrupt) for s in (signal.SIGHUP, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def settle_queued(run: RunDir, info: dict[str, Any]) -> Summary | None:
    """The summary of a run recorded as queued whose train is gone (kill -9 while it
    waited: its Slurm job went with the connection), written; None while its train still
    waits, or when it waits on another machine (its liveness cannot be read from here)."""
    queued = info["queued"]
    if queued.get("host") != socket.gethostname():
        return None
    try:
        os.kill(int(queued["pid"]), 0)
        return None
    except ProcessLookupError:
        pass
    except PermissionError:
        return None
    summary = cut_short(info, RunStatus.CONTROLLER_LOST, time.time(),
                        "train ended while the run waited in Slurm's queue; its job was "
                        "cancelled when its connection closed")
    write_summary(run, summary)
    return summary


def cancel_queued(run: RunDir, info: dict[str, Any], cluster: Cluster) -> None:
    """`stop` of a run still waiting in Slurm's queue: its job is cancelled (from the
    cluster's first node, as the run's user), and its train says the run was stopped."""
    write_private(run.path / STOP_REQUESTED, f"{time.time()}\n")
    first = cluster.nodes[0]
    conn = ssh.connect(first.name, first.ssh)
    try:
        result = conn.run(shlex.join(["scancel", f"--name={job_name(info['run_id'])}",
                                      f"--user={first.ssh.effective_user()}"]), timeout=30)
    finally:
        conn.close()
    if result.exit_code != 0:
        raise ClusterError(f"{first.name}: scancel failed: {result.stderr.strip()[-300:]}")
