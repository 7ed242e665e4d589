"""A run's hold on its nodes, from its check to its end: the connections preflight opened
(every later command of the run goes over them) and the master port claimed on node 0.
`close()` gives both back, on every exit path (the claim would lapse by itself)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..checks.preflight import Report, run_preflight
from ..checks.probe import release_port
from ..cluster import ssh
from ..cluster.fanout import each
from ..cluster.inventory import Cluster
from ..node.protocol import BOUND_WAIT

IN_FLIGHT = 0.5   # seconds an attached run's close() gives a release under way to answer


@dataclass
class Session:
    cluster: Cluster
    report: Report                                    # what preflight found
    clients: dict[str, ssh.Connection] = field(default_factory=dict)
    run_id: str | None = None                         # the run the port is claimed for
    releasing: threading.Thread | None = None         # see release_once_bound
    wait_release: bool = False                        # ... and close()

    @classmethod
    def check(cls, cluster: Cluster, *, master_port: int | None, nproc_per_node: int | None,
              run_id: str | None, share_gpus: bool = False, cordoned_ok: bool = False,
              opened: Mapping[str, ssh.Connection] | None = None,
              queued_gpus: dict[str, list[int]] | None = None) -> Session:
        """The check phase: preflight every node, keeping the connections it opened (or
        was given: OPENED); with RUN_ID (a launch), node 0's master port is claimed for it;
        with SHARE_GPUS, nodes in use by others are not refused; QUEUED_GPUS (train
        --queue: the GPUs Slurm gave the run on each node), only those used outside Slurm
        are."""
        report = run_preflight(cluster, master_port, strict_port=master_port is not None,
                               keep_connections=True, nproc_per_node=nproc_per_node,
                               run_id=run_id, share_gpus=share_gpus, opened=opened,
                               cordoned_ok=cordoned_ok, queued_gpus=queued_gpus)
        clients, report.clients = report.clients, {}   # the session owns them now
        return cls(cluster, report, clients, run_id)

    def release_once_bound(self, port: int, detached: bool) -> None:
        """The run started on its nodes: node 0's master-port claim is dropped once
        torchrun listens on PORT (or node 0's part ended; BOUND_WAIT at most): dropped
        before, a launch a moment later could take the same port. In the background, from
        now: an attached run's end does not wait for it. `close()` waits for it when the
        run is DETACHED (the launch is all this process does); an attached run's
        `close()` drops a claim still held at once (the run ended before torchrun
        listened, or Ctrl-C twice left it)."""
        self.releasing = threading.Thread(target=self._release, args=(port,), daemon=True)
        self.wait_release = detached
        self.releasing.start()

    def _release(self, once_bound: int | None = None) -> None:
        node0 = self.clients.get(self.cluster.nodes[0].name)
        if node0 is not None and self.run_id:
            try:
                release_port(self.cluster.nodes[0], node0, self.run_id, once_bound)
            except (OSError, TimeoutError, RuntimeError):
                pass  # the claim lapses by itself

    def close(self) -> None:
        if self.releasing is not None:
            # Detached: until the port is bound. Attached: a moment, for a release whose
            # claim is gone on the node but whose answer is still on its way back.
            self.releasing.join(timeout=BOUND_WAIT + 30 if self.wait_release else IN_FLIGHT)
        if self.releasing is None or (self.releasing.is_alive() and not self.wait_release):
            self._release()
        each(list(self.clients.values()), lambda conn: conn.close(), lambda conn: conn.name)
        self.clients.clear()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Take = Callable[[Cluster], dict[str, ssh.Connection]]


@contextmanager
def connected_ahead(nodes: Cluster | None) -> Iterator[Take]:
    """SSH connections to NODES, opened in the background while the block runs (a run
    waiting for Slurm's grant: the check that follows it need not open them then).
    `take(chosen)` hands over those of CHOSEN's nodes that opened (the caller owns them
    now) and closes the others; what was not handed over is closed at the end. NODES None:
    nothing is opened, `take` gives nothing."""
    if nodes is None:
        yield lambda chosen: {}
        return
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(each, nodes.nodes, lambda n: ssh.connect(n.name, n.ssh),
                         lambda n: n.name)
    handed: set[str] = set()

    def take(chosen: Cluster) -> dict[str, ssh.Connection]:
        got = {n: r.value for n, r in future.result().items() if r.value is not None}
        handed.update(got)
        for name, conn in got.items():
            if name not in chosen.names:
                conn.close()
        return {n: c for n, c in got.items() if n in chosen.names}

    try:
        yield take
    finally:
        pool.shutdown(wait=True)
        for name, r in future.result().items():
            if r.value is not None and name not in handed:
                r.value.close()
