"""The probe script itself, run with this machine's python: what it says about ports."""

import json
import socket
import subprocess
import sys

from orchestrator.probe import PROBE_SCRIPT


def run_probe(port: int, run: str | None = None) -> dict:
    request = json.dumps({"shared_path": "/", "addresses": [], "port": port, "run": run})
    p = subprocess.run([sys.executable, "-c", PROBE_SCRIPT], input=request,
                       capture_output=True, text=True, timeout=120, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def listener() -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_port_with_a_listener_is_taken_and_next_free_port_offered() -> None:
    s = listener()
    port = s.getsockname()[1]
    try:
        out = run_probe(port)
    finally:
        s.close()
    assert out["port_free"] is False
    assert out["free_port"] is not None and out["free_port"] != port


def test_port_left_in_time_wait_by_last_run_counts_as_free() -> None:
    # What a finished job leaves on node 0: its rendezvous server closed connections
    # first, so they sit in TIME_WAIT on the master port for a minute. torch binds with
    # SO_REUSEADDR and can listen there again, so preflight must not call the port taken.
    s = listener()
    port = s.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = s.accept()
    conn.close()        # the server side closes first: its socket goes to TIME_WAIT
    client.recv(1)
    client.close()
    s.close()
    # Without SO_REUSEADDR the port cannot be bound now; that is the false alarm.
    plain = socket.socket()
    try:
        plain.bind(("0.0.0.0", port))
        time_wait = False
    except OSError:
        time_wait = True
    finally:
        plain.close()
    assert time_wait, "test setup did not leave the port in TIME_WAIT"
    out = run_probe(port)
    assert out["port_free"] is True and out["free_port"] == port


def test_two_launches_at_once_claim_different_ports() -> None:
    """Two users starting jobs at the same moment: each launch claims its master port on
    node 0 before either torchrun listens, so the second moves on instead of colliding."""
    import os
    import secrets

    from orchestrator.probe import LEASE_DIR

    s = listener()
    base = s.getsockname()[1]
    s.close()  # a port that is free now
    a, b = f"run-a-{secrets.token_hex(3)}", f"run-b-{secrets.token_hex(3)}"
    try:
        first, second = run_probe(base, a), run_probe(base, b)
        assert first["port_free"] is True and first["free_port"] == base
        assert second["port_free"] is False and second["free_port"] not in (None, base)
        # A plain preflight (no run) sees the claims but makes none.
        assert run_probe(base)["port_free"] is False
        # Once run A's launch is over its claim is released, and the port is free again.
        for name in os.listdir(LEASE_DIR):
            if name.endswith("." + a):
                os.unlink(os.path.join(LEASE_DIR, name))
        assert run_probe(base)["port_free"] is True
    finally:
        for name in os.listdir(LEASE_DIR):
            if name.endswith(("." + a, "." + b)):
                os.unlink(os.path.join(LEASE_DIR, name))
    assert oct(os.stat(LEASE_DIR).st_mode & 0o7777) == "0o1777"
