"""The node side of preflight (orchestrator/node/probe.py) as a module, its functions run
for real on this machine: leases in a directory of the test's own, real sockets on
localhost, this machine's mount table. test_probe_verbs.py runs the verbs whole."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from orchestrator.node import probe as node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cluster_env_lines_are_read_as_the_shell_would_set_them(tmp_path: Path) -> None:
    env = tmp_path / "cluster.env"
    env.write_text('# made by the common role\nMASTER_ADDR="10.0.0.1"\n\n'
                   "NCCL_SOCKET_IFNAME = eth1\nnot a setting\n")
    assert node.read_cluster_env(str(env)) == {"MASTER_ADDR": "10.0.0.1",
                                               "NCCL_SOCKET_IFNAME": "eth1"}
    assert node.read_cluster_env(str(tmp_path / "missing")) == {}


def test_a_missing_or_broken_state_file_says_which_and_why(tmp_path: Path) -> None:
    from orchestrator.node.util import read_json_or_why
    assert read_json_or_why(str(tmp_path / "x.json")) == (None, f"{tmp_path}/x.json is missing")
    (tmp_path / "bad.json").write_text("{")
    data, why = read_json_or_why(str(tmp_path / "bad.json"))
    assert data is None and why is not None and why.startswith(f"{tmp_path}/bad.json: ")


def test_the_mount_table_is_read_with_its_escapes(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text("22 1 0:21 / / rw - ext4 /dev/vda rw\n"
                    "40 22 0:35 / /mnt/my\\040share rw,relatime shared:1 - nfs4 "
                    "srv:/export rw\n")
    assert node.mounts(str(info)) == [("/", "ext4", "/dev/vda"),
                                      ("/mnt/my share", "nfs4", "srv:/export")]
    assert any(m[0] == "/" for m in node.mounts())  # this machine's own table


@pytest.mark.parametrize("make,kind,says", [
    (lambda p: p / "nowhere", "missing", "No such file or directory"),
    (lambda p: p, "not_mounted", "is not a mount point (it is a directory of"),
])
def test_a_shared_path_that_is_not_the_share_is_named_with_its_cause(
        tmp_path: Path, make, kind: str, says: str) -> None:
    res = node.check_shared({"path": str(make(tmp_path)), "fstypes": None}, "alice", 1000)
    assert (res["ok"], res["kind"]) == (False, kind) and says in res["error"]


# --- master-port claims ---------------------------------------------------------------

def test_two_launches_claim_different_ports_and_a_plain_look_claims_none(
        tmp_path: Path) -> None:
    leases, port = str(tmp_path), free_port()
    assert node.find_port(port, "alice", None, leases) == {"port_free": True,
                                                           "free_port": port}
    assert os.listdir(leases) == []  # preflight alone claims nothing
    first = node.find_port(port, "alice", "run-a", leases)
    second = node.find_port(port, "bob", "run-b", leases)
    assert first == {"port_free": True, "free_port": port}
    assert second["port_free"] is False and second["free_port"] not in (None, port)
    assert sorted(os.listdir(leases)) == sorted([f"{port}.alice.run-a",
                                                 f"{second['free_port']}.bob.run-b"])
    assert oct(os.stat(leases).st_mode & 0o7777) == "0o1777"


def test_an_expired_claim_is_no_claim_and_ones_own_are_cleared(tmp_path: Path) -> None:
    leases, port = str(tmp_path), free_port()
    old = time.time() - node.LEASE_S - 5
    for who in ("alice", "bob"):
        path = tmp_path / f"{port}.{who}.old-run"
        path.touch()
        os.utime(path, (old, old))
    assert node.claims(port, leases) == []
    assert node.find_port(port, "alice", "new-run", leases)["port_free"] is True
    assert sorted(os.listdir(leases)) == [f"{port}.alice.new-run", f"{port}.bob.old-run"]


def test_a_detached_launchs_claim_is_dropped_once_torchrun_listens(tmp_path: Path) -> None:
    """A detached train ends before torchrun's store listens: its claim stays until the
    port is bound, so that a launch meanwhile takes another port; then it is dropped."""
    leases, port = str(tmp_path), free_port()
    assert node.find_port(port, "alice", "run-a", leases)["port_free"] is True
    store = socket.socket()
    store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def torchrun_listens() -> None:
        time.sleep(1.0)
        assert node.find_port(port, "bob", "run-b", leases)["free_port"] != port
        store.bind(("0.0.0.0", port))
        store.listen()

    listening = threading.Thread(target=torchrun_listens)
    listening.start()
    try:
        started = time.monotonic()
        node.release("run-a", leases, once_bound=port, wait=30)
        assert 1.0 <= time.monotonic() - started < 10
        listening.join()
        assert not [n for n in os.listdir(leases) if n.endswith(".run-a")]
    finally:
        store.close()
    started = time.monotonic()
    node.release("run-c", leases, once_bound=free_port(), wait=1.0)   # never bound
    assert time.monotonic() - started < 5


def test_a_port_with_a_listener_is_not_free() -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", 0))
        s.listen()
        assert node.port_free(s.getsockname()[1]) is False
    assert node.port_free(free_port()) is True


def test_names_resolve_to_ipv4_or_none() -> None:
    assert node.resolve(["127.0.0.1", "localhost", "no-such-host.invalid"]) == {
        "127.0.0.1": "127.0.0.1", "localhost": "127.0.0.1", "no-such-host.invalid": None}


# --- node 0's listener and round 2 ----------------------------------------------------

def listening(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(8)
    return s


def test_the_listener_greets_every_node_then_frees_the_port_and_the_token(
        tmp_path: Path) -> None:
    port, token = free_port(), tmp_path / "token"
    token.write_text("v" * 8)
    spec = {"nonce": "n1", "expect": 2, "seconds": 30}
    t = threading.Thread(target=node.serve, args=(listening(port), spec, str(token)))
    t.start()
    first = node.reach({"addr": "127.0.0.1", "port": port, "nonce": "n1", "timeout": 3,
                        "token": {"path": str(token), "value": "v" * 8}})
    assert first["token"] == {"ok": True, "error": None}
    assert first["connect"] == {"ok": True, "error": None}
    assert node.greeted("127.0.0.1", port, "n1", 3)[0] is True
    t.join(timeout=10)
    assert not t.is_alive() and not token.exists() and node.port_free(port)


def test_round_two_names_a_wrong_token_another_program_and_a_closed_port(
        tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("something else")
    port = free_port()
    with listening(port) as other:  # a program that is not our listener
        def answer() -> None:
            conn, _ = other.accept()
            conn.sendall(b"SSH-2.0-OpenSSH\n")
            conn.recv(8)
            conn.close()
        threading.Thread(target=answer, daemon=True).start()
        out = node.reach({"addr": "127.0.0.1", "port": port, "nonce": "n", "timeout": 3,
                          "token": {"path": str(token), "value": "v"}})
    assert out["token"] == {"ok": False, "error": "it holds something else"}
    assert out["connect"]["ok"] is False
    assert out["connect"]["error"].startswith("another program answers there (b'SSH-2.0")
    closed = node.reach({"addr": "127.0.0.1", "port": free_port(), "nonce": "n",
                         "timeout": 3, "token": None})
    assert closed["connect"] == {"ok": False, "error": "Connection refused"}


def test_a_listener_whose_nodes_do_not_come_is_stopped_by_its_nonce_only() -> None:
    port = free_port()
    spec = {"nonce": "n2", "expect": 3, "seconds": 30}
    t = threading.Thread(target=node.serve, args=(listening(port), spec, None))
    t.start()
    node.stop_listener(port, "another-nonce")  # not ours: it is counted as a node
    assert t.is_alive()
    node.stop_listener(port, "n2")
    t.join(timeout=10)
    assert not t.is_alive() and node.port_free(port)


def test_an_unknown_verb_gets_the_usage(capsys) -> None:
    from orchestrator.node.__main__ import main
    with pytest.raises(SystemExit) as ended:
        main(["launch"])
    assert ended.value.code == 2
    assert "usage: node.py" in capsys.readouterr().err
