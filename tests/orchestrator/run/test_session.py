"""A run's hold on its nodes (run/session.py): node 0's master-port claim given back once
torchrun listens on the port, in the background, so that the run's end does not wait for
it. Node 0 is this machine (the real node package, under a home of the test's own); the
claim is a real claim file, dropped by the node package's `release`."""

from __future__ import annotations

import getpass
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import cast

from orchestrator.checks.preflight import Report
from orchestrator.cluster.inventory import Cluster, NodeSpec
from orchestrator.cluster.ssh import Connection, SshTarget
from orchestrator.node.protocol import PORT_CLAIMS_DIR
from orchestrator.run.session import Session

from ..local_node import LocalNode, installed, unused_port


class Node(LocalNode):
    """A node reached without SSH; `close` is the connection's end."""
    closed = False
    name = "n0"

    def close(self) -> None:
        self.closed = True


def session(tmp: Path, run_id: str) -> tuple[Session, Node]:
    installed(tmp / "n0")
    node = Node(tmp / "n0")
    cluster = Cluster(tmp / "hosts", (NodeSpec("n0", SshTarget("127.0.0.1"), "127.0.0.1"),))
    return Session(cluster, cast(Report, None), {"n0": cast(Connection, node)}, run_id), node


def claim(port: int, run_id: str) -> Path:
    os.makedirs(PORT_CLAIMS_DIR, mode=0o1777, exist_ok=True)
    path = Path(PORT_CLAIMS_DIR) / f"{port}.{getpass.getuser()}.{run_id}"
    path.touch()
    return path


def test_the_claim_goes_once_torchrun_listens_not_at_the_runs_end(tmp_path: Path) -> None:
    """Started, the run's claim is dropped as soon as its port is bound (while the run
    goes on), not when the run ends: close() then has nothing left to wait for."""
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    s, node = session(tmp_path, run_id)
    port = unused_port()
    held = claim(port, run_id)
    try:
        t0 = time.monotonic()
        s.release_once_bound(port, detached=False)
        assert time.monotonic() - t0 < 0.5     # in the background
        time.sleep(1.0)
        assert held.exists()                   # torchrun does not listen yet
        with socket.socket() as store:         # torchrun's store on node 0
            store.bind(("0.0.0.0", port))
            store.listen()
            deadline = time.monotonic() + 20
            while held.exists():
                assert time.monotonic() < deadline, "the claim was not given back"
                time.sleep(0.05)
        t0 = time.monotonic()
        s.close()
        assert time.monotonic() - t0 < 1.0 and node.closed
        assert sum("release" in r for r in node.runs) == 1
    finally:
        held.unlink(missing_ok=True)


def test_an_attached_run_that_ends_before_torchrun_listens_gives_its_claim_back_at_once(
        tmp_path: Path) -> None:
    """Attached, the run ended (or Ctrl-C twice left it) before torchrun listened: close()
    drops the claim now, not after waiting for a port nobody will bind."""
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    s, node = session(tmp_path, run_id)
    held = claim(unused_port(), run_id)
    try:
        s.release_once_bound(int(held.name.split(".")[0]), detached=False)
        time.sleep(0.5)
        t0 = time.monotonic()
        s.close()
        assert time.monotonic() - t0 < 5 and not held.exists() and node.closed
    finally:
        held.unlink(missing_ok=True)


def test_a_detached_run_holds_its_claim_until_torchrun_listens(tmp_path: Path) -> None:
    """Detached, the launch is all this process does: close() waits until the port is
    bound before the claim goes (dropped before, a launch a moment later could take it)."""
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    s, node = session(tmp_path, run_id)
    port = unused_port()
    held = claim(port, run_id)
    try:
        s.release_once_bound(port, detached=True)
        closing = threading.Thread(target=s.close)
        closing.start()
        closing.join(timeout=1.5)
        assert closing.is_alive() and held.exists()   # waiting for the bind
        with socket.socket() as store:
            store.bind(("0.0.0.0", port))
            store.listen()
            closing.join(timeout=20)
        assert not closing.is_alive() and not held.exists() and node.closed
    finally:
        held.unlink(missing_ok=True)


def test_a_run_that_never_started_gives_its_claim_back_on_close(tmp_path: Path) -> None:
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    s, node = session(tmp_path, run_id)
    held = claim(unused_port(), run_id)
    try:
        s.close()
        assert not held.exists() and node.closed
    finally:
        held.unlink(missing_ok=True)
