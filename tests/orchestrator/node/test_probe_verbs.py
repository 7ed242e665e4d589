"""The node package's probe (`node.py probe|reach|unlisten`), run with this machine's
python: what it says about ports."""

import json
import os
import socket
import subprocess
import sys

from ..local_node import unused_port

# The node package's verbs, as a node runs them (`node.py VERB`).
NODE = [sys.executable, "-m", "orchestrator.node"]


def run_probe(port: int, run: str | None = None) -> dict:
    request = json.dumps({"shared": {"path": "/", "fstypes": None}, "addresses": [],
                          "port": port, "span": 200, "run": run})
    p = subprocess.run([*NODE, "probe"], input=request,
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

    from orchestrator.node.preflight import LEASE_DIR

    base = unused_port()
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


# --- round 1 and 2 against this machine: torch cache, shared path, master-port listener ---

import time  # noqa: E402
from pathlib import Path  # noqa: E402

from orchestrator.node.preflight import port_free  # noqa: E402


def probe_request(tmp_path: Path, **kw) -> dict:
    out = run_probe_with(tmp_path, {"shared": {"path": str(tmp_path), "fstypes": None},
                                    "addresses": [], "port": None, "span": 200, "run": None,
                                    "state_dir": str(tmp_path / "state"), **kw})
    return out


def run_probe_with(tmp_path: Path, request: dict) -> dict:
    env = dict(os.environ, HOME=str(tmp_path / "home"))
    p = subprocess.run([*NODE, "probe"], input=json.dumps(request),
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def fake_environment(tmp_path: Path) -> Path:
    """An environment whose python is a named test double: it answers the torch check
    (and counts how often it was asked) and its version; nothing is imported."""
    prefix = tmp_path / "env"
    dist = prefix / "lib" / "python3.11" / "site-packages" / "torch-2.13.0+cpu.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Name: torch\nVersion: 2.13.0+cpu\n")
    (prefix / "bin").mkdir()
    python = prefix / "bin" / "python"
    checks = json.dumps({"torch_import": "ok", "version": "2.13.0+cpu", "gpu_count": 0,
                         "cuda_available": False, "distributed": True, "nccl": False})
    python.write_text(f"#!/bin/sh\n[ \"$1\" = -I ] && echo 3.11.2 && exit 0\n"
                      f"echo imported >> {tmp_path}/torch-imports\necho '{checks}'\n")
    python.chmod(0o755)
    (prefix / "bin" / "torchrun").write_text("#!/bin/sh\n")
    (prefix / "bin" / "torchrun").chmod(0o755)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "python_env.json").write_text(json.dumps(
        {"prefix": str(prefix), "python": str(python),
         "torchrun": str(prefix / "bin" / "torchrun")}))
    return prefix


def imports(tmp_path: Path) -> int:
    path = tmp_path / "torch-imports"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_torch_is_imported_only_when_the_environment_changed(tmp_path: Path) -> None:
    prefix = fake_environment(tmp_path)
    first = probe_request(tmp_path)
    assert first["torch"]["ok"] and not first["torch"]["cached"] and imports(tmp_path) == 1
    assert first["fingerprint"]["packages"] == {"torch": "2.13.0+cpu"}
    (tmp_path / "state" / "fingerprint.json").write_text(json.dumps(first["fingerprint"]))
    second = probe_request(tmp_path)
    assert second["torch"]["cached"] and second["torch"]["version"] == "2.13.0+cpu"
    assert imports(tmp_path) == 1, "a steady-state probe imported torch"
    cache = tmp_path / "home" / ".cache" / "clustertrain" / "torch-check.json"
    assert oct(cache.stat().st_mode & 0o777) == "0o600"
    # Another package version: the environment changed, so torch is checked again...
    site = prefix / "lib" / "python3.11" / "site-packages"
    (site / "torch-2.13.0+cpu.dist-info").rename(site / "torch-2.13.1.dist-info")
    (site / "torch-2.13.1.dist-info" / "METADATA").write_text("Name: torch\nVersion: 2.13.1\n")
    (tmp_path / "state" / "fingerprint.json").unlink()
    third = probe_request(tmp_path)
    assert not third["torch"]["cached"] and imports(tmp_path) == 2
    # ...except when it differs from the provisioned one: refused for drift, no import.
    (tmp_path / "state" / "fingerprint.json").write_text(json.dumps(first["fingerprint"]))
    (site / "extra-1.0.dist-info").mkdir()
    (site / "extra-1.0.dist-info" / "METADATA").write_text("Name: extra\nVersion: 1.0\n")
    fourth = probe_request(tmp_path)
    assert fourth["torch"]["skipped"] and imports(tmp_path) == 2


def test_shared_path_that_is_not_a_mount_point_is_refused(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    out = probe_request(tmp_path)
    assert out["shared"]["ok"] is False and out["shared"]["kind"] == "not_mounted"
    assert f"{tmp_path} is not a mount point" in out["shared"]["error"]



def test_shared_path_of_the_wrong_type_and_writable_share(tmp_path: Path, shm_share) -> None:
    out = probe_request(tmp_path, shared={"path": str(shm_share), "fstypes": ["nfs", "nfs4"]})
    assert out["shared"]["kind"] == "wrong_type"
    assert "is a tmpfs mount of" in out["shared"]["error"]
    out = probe_request(tmp_path, shared={"path": str(shm_share), "fstypes": None})
    assert out["shared"] == {"ok": True, "kind": None, "error": None, "fstype": "tmpfs"}
    user_dir = shm_share / "checkpoints" / out["user"]
    assert user_dir.is_dir() and list(user_dir.iterdir()) == []  # the probe file is gone


KEY = "k" * 64   # the run's key (checks/probe.py Rendezvous), on the verbs' stdin


def reach(port: int, nonce: str, token: dict | None, timeout: float = 3) -> dict:
    request = {"addr": "127.0.0.1", "port": port, "nonce": nonce, "key": KEY,
               "timeout": timeout, "token": token}
    p = subprocess.run([*NODE, "reach"], input=json.dumps(request),
                       capture_output=True, text=True, timeout=60, check=True)
    return json.loads(p.stdout)


def bindable(port: int) -> bool:
    """As torch's TCPStore binds: with SO_REUSEADDR (TIME_WAIT does not count)."""
    return port_free(port)


def wait_until(check, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_node0_listens_until_every_node_connected_and_reads_the_token(tmp_path, shm_share):
    port = unused_port()
    token = {"name": ".clustertrain-token-test", "value": "v" * 32}
    out = probe_request(tmp_path, port=port, addresses=["127.0.0.1"],
                        shared={"path": str(shm_share), "fstypes": None, "token": token},
                        listen={"nonce": "n1", "key": KEY, "expect": 3, "address": "127.0.0.1",
                                "timeout": 3, "seconds": 30})
    assert out["listener"] == {"port": port, "ok": True, "error": None,
                               "self": {"ok": True, "error": None}}
    token_file = shm_share / "checkpoints" / token["name"]
    assert token_file.read_text() == token["value"]
    # The two other "nodes": each reads the token, then connects.
    one = reach(port, "n1", {"path": str(token_file), "value": token["value"]})
    assert one["token"]["ok"] and one["connect"] == {"ok": True, "error": None}
    assert not bindable(port), "the listener ended before every node connected"
    two = reach(port, "n1", {"path": str(token_file), "value": token["value"]})
    assert two["connect"]["ok"]
    # The last connection closed the listener: the port is free for torchrun, no token left.
    assert bindable(port) and wait_until(lambda: not token_file.exists())
    assert not reach(port, "n1", None, timeout=1)["connect"]["ok"]


def test_a_listener_is_stopped_when_a_node_does_not_come(tmp_path, shm_share) -> None:
    port = unused_port()
    out = probe_request(tmp_path, port=port, addresses=["127.0.0.1"],
                        shared={"path": str(shm_share), "fstypes": None},
                        listen={"nonce": "n2", "key": KEY, "expect": 3, "address": "127.0.0.1",
                                "timeout": 3, "seconds": 30})
    assert out["listener"]["ok"] and not bindable(port)
    subprocess.run([*NODE, "unlisten", str(port), "n2"], check=True, timeout=30,
                   input=json.dumps({"key": KEY}), text=True)   # the key: never argv
    assert wait_until(lambda: bindable(port))
