"""The node side of preflight (orchestrator/node/preflight.py) as a module, its functions run
for real on this machine: leases in a directory of the test's own, real sockets on
localhost, this machine's mount table. test_probe_verbs.py runs the verbs whole."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.defaults import RENDEZVOUS_SPAN
from orchestrator.node import preflight as node

KEY = "k" * 64   # the run's key (checks/probe.py Rendezvous)


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


# --- the user's own places on the share ------------------------------------------------

OTHER = "nobody"   # another user of this machine: a squatter, or a second launch's user


def root_only() -> None:
    if os.getuid() != 0:
        pytest.skip("gives files to another user (chown): needs root")


@pytest.fixture
def share(shm_share: Path) -> Path:
    """/dev/shm as the share (conftest's shm_share); this user is root here."""
    root_only()
    return shm_share


def shared(path: Path) -> dict:
    return node.check_shared({"path": str(path), "fstypes": None}, "root", 0)


def given(path: Path, user: str = OTHER) -> None:
    pw = pwd.getpwnam(user)
    os.lchown(path, pw.pw_uid, pw.pw_gid)


def test_the_users_own_directory_is_made_for_them_private(share: Path) -> None:
    assert shared(share)["ok"] is True
    mine = share / "checkpoints" / "root"
    assert mine.is_dir() and mine.stat().st_mode & 0o777 == 0o700
    assert os.listdir(mine) == []   # the writability probe is gone


def test_a_directory_squatted_by_another_user_is_refused_naming_the_owner(
        share: Path) -> None:
    """Another user made checkpoints/<user> first, open to all: the run would write its
    checkpoints and records where that user reads and replaces them."""
    mine = share / "checkpoints" / "root"
    mine.mkdir()
    mine.chmod(0o777)
    given(mine)
    res = shared(share)
    assert (res["ok"], res["kind"]) == (False, "not_own")
    assert res["error"] == (f"{mine} belongs to {OTHER}, not to root: {OTHER} could read "
                            "and replace what root's runs keep there")
    assert res["fix"].startswith(f"ask {OTHER} or an admin to remove it (sudo rm -rf {mine})")
    assert os.listdir(mine) == []   # nothing was written into it


def test_a_squatted_place_further_down_is_refused_too(share: Path) -> None:
    """The user's directory is theirs, but where their runs keep their states
    (.clustertrain/runs) was made by another while it was open."""
    runs = share / "checkpoints" / "root" / ".clustertrain" / "runs"
    runs.mkdir(parents=True)
    runs.parent.parent.chmod(0o700)
    given(runs)
    res = shared(share)
    assert res["kind"] == "not_own" and res["error"].startswith(f"{runs} belongs to {OTHER}")


def test_a_link_in_the_users_place_is_refused_not_followed(share: Path,
                                                            tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    mine = share / "checkpoints" / "root"
    mine.symlink_to(elsewhere)
    given(mine)
    res = shared(share)
    assert res["kind"] == "not_own"
    assert res["error"] == (f"{mine} is a symbolic link (to {elsewhere}), made by {OTHER}, "
                            "not a directory of root's own")
    assert os.listdir(elsewhere) == []


def test_the_users_own_directory_writable_by_others_is_refused_with_the_chmod(
        share: Path) -> None:
    mine = share / "checkpoints" / "root"
    mine.mkdir()
    mine.chmod(0o777)
    res = shared(share)
    assert res["kind"] == "open"
    assert res["error"].startswith(f"{mine} is writable by its group and others (mode 0777)")
    assert res["fix"].startswith(f"chmod go-w {mine}")
    mine.chmod(0o755)
    assert shared(share)["ok"] is True


# --- master-port claims ---------------------------------------------------------------

def as_user(user: str, fn: Callable[..., Any], *args: Any) -> Any:
    """FN(*ARGS) in a child process that runs as USER, a real user of this machine: its
    files are that user's, as a second user's launch on node 0 makes them."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            pw = pwd.getpwnam(user)
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            os.write(write, json.dumps(fn(*args)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        said = fh.read()
    os.waitpid(pid, 0)
    return json.loads(said)


@pytest.fixture
def leases():
    """A claims directory like /tmp/clustertrain-ports, that every user may reach."""
    root_only()
    path = tempfile.mkdtemp(prefix="clustertrain-ports-test-", dir="/tmp")
    os.chmod(path, 0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_two_launches_claim_different_ports_and_a_plain_look_claims_none(
        leases: str) -> None:
    port = free_port()
    assert node.find_port(port, None, 200, leases) == {"port_free": True, "free_port": port}
    assert os.listdir(leases) == []  # preflight alone claims nothing
    first = node.find_port(port, "run-a", 200, leases)
    second = as_user(OTHER, node.find_port, port, "run-b", 200, leases)
    assert first == {"port_free": True, "free_port": port}
    assert second["port_free"] is False and second["free_port"] not in (None, port)
    assert sorted(os.listdir(leases)) == sorted([f"{port}.root.run-a",
                                                 f"{second['free_port']}.{OTHER}.run-b"])


def test_the_claims_directory_is_made_like_tmp_and_one_made_otherwise_is_not_used(
        tmp_path: Path) -> None:
    """bob made /tmp/clustertrain-ports first, open to himself only: launches still find a
    port (unclaimed, with a warning naming him) instead of failing."""
    made = str(tmp_path / "ports")
    assert node.find_port(free_port(), None, 200, made)["port_free"] is True
    assert oct(os.stat(made).st_mode & 0o7777) == "0o1777"
    root_only()
    taken = tmp_path / "taken"
    taken.mkdir(mode=0o755)
    given(taken)
    port = free_port()
    found = node.find_port(port, "run-a", 200, str(taken))
    assert found["port_free"] is True and found["free_port"] == port
    assert found["port_warning"].endswith(f"{taken} is mode 0755, not 1777 (made by "
                                          f"{OTHER}): ask {OTHER} or an admin to remove it "
                                          f"(sudo rm -rf {taken})")


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory every user may reach (pytest's tmp_path is root's alone)."""
    root_only()
    path = tempfile.mkdtemp(prefix="clustertrain-probe-test-", dir="/tmp")
    os.chmod(path, 0o755)
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def acl_denying(path: str, uid: int) -> None:
    """An access ACL on PATH that denies UID everything (as `setfacl -m u:UID:---` sets
    it; this machine may lack setfacl): its mode still reads as before."""
    entries = [(0x01, 7, 0xFFFFFFFF), (0x02, 0, uid), (0x04, 7, 0xFFFFFFFF),
               (0x10, 7, 0xFFFFFFFF), (0x20, 7, 0xFFFFFFFF)]
    os.setxattr(path, "system.posix_acl_access", struct.pack("<I", 2) + b"".join(
        struct.pack("<HHI", *e) for e in entries))


def test_a_claims_directory_another_user_made_decides_nothing_for_this_one(
        reachable: Path) -> None:
    """bob made the claims directory first, like /tmp (sticky, mode 1777), and denied
    alice in an ACL: its mode still reads 1777. Alice's launch still finds its port (not
    claimed, with a warning naming bob and the fix) instead of being refused until an admin
    cleans up; so does a directory of root's that carries an ACL."""
    root_only()
    alice = pwd.getpwnam("daemon").pw_uid
    squatted = reachable / "ports"
    squatted.mkdir()
    squatted.chmod(0o1777)
    given(squatted)
    acl_denying(str(squatted), alice)
    assert oct(squatted.stat().st_mode & 0o7777) == "0o1777"
    port = free_port()
    found = as_user("daemon", node.find_port, port, "run-a", 200, str(squatted))
    assert (found["port_free"], found["free_port"]) == (True, port), found
    assert found["port_warning"].endswith(
        f"{squatted} is not root's (made by {OTHER}): ask an admin to remove it "
        f"(sudo rm -rf {squatted}); site.yml makes it, root's, at boot"), found
    assert os.listdir(squatted) == []
    roots = reachable / "roots"
    roots.mkdir()
    roots.chmod(0o1777)
    acl_denying(str(roots), alice)
    found = as_user("daemon", node.find_port, port, "run-a", 200, str(roots))
    assert found["port_warning"].endswith(
        f"{roots} carries an ACL (getfacl {roots}): ask an admin to remove it "
        f"(sudo rm -rf {roots}); site.yml makes it, root's, at boot"), found


def test_the_claims_directory_is_the_one_the_common_role_makes_root_s_at_boot() -> None:
    """One place under /run, where only root makes directories: the common role's
    tmpfiles.d entry, which every boot makes anew."""
    import yaml

    from orchestrator.node.protocol import PORT_CLAIMS_DIR
    roles = Path(__file__).resolve().parents[3] / "roles" / "common"
    made = yaml.safe_load((roles / "vars" / "main.yml").read_text())["common_port_claims_dir"]
    assert made == PORT_CLAIMS_DIR == node.LEASE_DIR and made.startswith("/run/")
    entry = (roles / "templates" / "clustertrain-ports.conf.j2").read_text().splitlines()[-1]
    assert entry == "d {{ common_port_claims_dir }} 1777 root root -"


def test_a_claim_is_released_only_by_its_owner(leases: str) -> None:
    """bob's file named like alice's claim of her run is bob's: her release leaves it (and
    his claim cannot stand in for hers, live_claims)."""
    port = free_port()
    forged = Path(leases, f"{port}.root.run-a")
    as_user(OTHER, forged.touch)
    assert node.find_port(port + 1, "run-a", 200, leases)["port_free"] is True
    node.release("run-a", leases)
    assert os.listdir(leases) == [forged.name]


def test_an_expired_claim_is_no_claim_and_ones_own_are_cleared(leases: str) -> None:
    port = free_port()
    old = time.time() - node.LEASE_S - 5
    for who in ("root", OTHER):
        path = Path(leases) / f"{port}.{who}.old-run"
        path.touch()
        os.utime(path, (old, old))
        given(path, who)
    assert node.claims(port, leases) == []
    assert node.find_port(port, "new-run", 200, leases)["port_free"] is True
    assert sorted(os.listdir(leases)) == [f"{port}.{OTHER}.old-run", f"{port}.root.new-run"]


def test_another_users_junk_claims_do_not_exhaust_the_ports(leases: str) -> None:
    """bob fills the claims directory: a claim for every port of the range in his own
    name, one in alice's name for each (his too: he owns the file), and one dated ahead.
    His own launches find no port; alice's take one past the few ports his claims may
    hold (MAX_CLAIMS)."""
    port = free_port()

    def junk() -> None:
        future = time.time() + 3600
        for p in range(port, port + RENDEZVOUS_SPAN):
            for name in (f"{p}.{OTHER}.junk", f"{p}.root.forged", f"{p}.{OTHER}.late"):
                Path(leases, name).touch()
            os.utime(Path(leases, f"{p}.{OTHER}.late"), (future, future))
    as_user(OTHER, junk)
    assert len(os.listdir(leases)) == 3 * RENDEZVOUS_SPAN
    assert as_user(OTHER, node.find_port, port, "run-b", 200, leases)["free_port"] is None
    found = node.find_port(port, "run-a", 200, leases)
    assert found["free_port"] is not None
    assert port < found["free_port"] <= port + node.MAX_CLAIMS
    assert Path(leases, f"{found['free_port']}.root.run-a").stat().st_uid == 0
    counted = node.live_claims("root", leases)
    assert {c.user for c in counted} == {OTHER, "root"} and len(counted) == node.MAX_CLAIMS + 1
    assert not [c for c in counted if c.user == "root" and c.run == "forged"]


def test_a_detached_launchs_claim_is_dropped_once_torchrun_listens(leases: str) -> None:
    """A detached train ends before torchrun's store listens: its claim stays until the
    port is bound, so that a launch meanwhile takes another port; then it is dropped."""
    port = free_port()
    assert node.find_port(port, "run-a", 200, leases)["port_free"] is True
    store = socket.socket()
    store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def torchrun_listens() -> None:
        time.sleep(1.0)
        assert as_user(OTHER, node.find_port, port, "run-b", 200, leases)["free_port"] != port
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
    spec = {"nonce": "n1", "key": KEY, "expect": 2, "seconds": 30}
    t = threading.Thread(target=node.serve, args=(listening(port), spec, str(token)))
    t.start()
    first = node.reach({"addr": "127.0.0.1", "port": port, "nonce": "n1", "key": KEY, "timeout": 3,
                        "token": {"path": str(token), "value": "v" * 8}})
    assert first["token"] == {"ok": True, "error": None}
    assert first["connect"] == {"ok": True, "error": None}
    assert node.greeted("127.0.0.1", port, "n1", KEY, 3)[0] is True
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
        out = node.reach({"addr": "127.0.0.1", "port": port, "nonce": "n", "key": KEY, "timeout": 3,
                          "token": {"path": str(token), "value": "v"}})
    assert out["token"] == {"ok": False, "error": "it holds something else"}
    assert out["connect"]["ok"] is False
    assert out["connect"]["error"].startswith("another program answers there (b'SSH-2.0")
    closed = node.reach({"addr": "127.0.0.1", "port": free_port(), "nonce": "n", "key": KEY,
                         "timeout": 3, "token": None})
    assert closed["connect"] == {"ok": False, "error": "Connection refused"}


def test_round_two_ahead_waits_for_node_0_to_listen_and_reads_the_token_it_holds(
        tmp_path: Path) -> None:
    """A node whose probe ends before node 0 listens connects once it does (refused
    meanwhile), and reads the token while its connection keeps it there: it is the last
    node, and the listener removes the token once the last one has closed."""
    port, token = free_port(), tmp_path / "token"
    token.write_text("v" * 8)
    req = {"port": port, "nonce": "n3", "key": KEY, "timeout": 3, "wait": 5,
           "token": {"path": str(token), "value": "v" * 8}}
    spec = {"nonce": "n3", "key": KEY, "expect": 1, "seconds": 30}
    later = threading.Timer(0.5, lambda: node.serve(listening(port), spec, str(token)))
    later.start()
    out = node.reach_ahead(req, "127.0.0.1")
    later.join()
    assert out is not None and out["seconds"] >= 0.4
    assert (out["addr"], out["port"]) == ("127.0.0.1", port)
    assert out["token"] == {"ok": True, "error": None}
    assert out["connect"] == {"ok": True, "error": None}
    assert not token.exists() and node.port_free(port)


def test_round_two_ahead_leaves_to_round_two_what_it_cannot_tell(tmp_path: Path) -> None:
    """Nobody listens within the wait, or another program holds the port (node 0 chose
    another): None, and round 2 asks the node again at node 0's port."""
    req = {"port": free_port(), "nonce": "n4", "key": KEY, "timeout": 3, "wait": 0.3,
           "token": {"path": str(tmp_path / "token"), "value": "v"}}
    assert node.reach_ahead(req, "127.0.0.1") is None
    port = free_port()
    with listening(port) as other:
        def answer() -> None:
            conn, _ = other.accept()
            conn.sendall(b"SSH-2.0-OpenSSH\n")
            conn.close()
        threading.Thread(target=answer, daemon=True).start()
        assert node.reach_ahead({**req, "port": port}, "127.0.0.1") is None
    assert node.reach_ahead(req, None) is None   # node 0's address did not resolve here


def test_another_preflights_nodes_at_the_same_port_are_not_counted(tmp_path: Path) -> None:
    """Two users' preflights at once try the same port ahead: a node of the other one
    (greeted with a nonce it did not expect) is not counted, even as the last expected,
    and every node of this preflight still gets through and reads the token."""
    port, token = free_port(), tmp_path / "token"
    token.write_text("v" * 8)
    spec = {"nonce": "mine", "key": KEY, "expect": 2, "seconds": 30}
    t = threading.Thread(target=node.serve, args=(listening(port), spec, str(token)))
    t.start()
    theirs = {"port": port, "nonce": "theirs", "key": "t" * 64, "timeout": 3, "wait": 2,
              "token": {"path": str(tmp_path / "their-token"), "value": "w"}}
    mine = {**theirs, "nonce": "mine", "key": KEY,
            "token": {"path": str(token), "value": "v" * 8}}
    assert node.reach_ahead(theirs, "127.0.0.1") is None          # before ours
    first = node.reach_ahead(mine, "127.0.0.1")
    assert first is not None and first["connect"]["ok"] and first["token"]["ok"]
    # as the last expected
    assert node.greeted("127.0.0.1", port, "theirs", "t" * 64, 3)[0] is False
    assert node.reach_ahead(theirs, "127.0.0.1") is None
    last = node.reach_ahead(mine, "127.0.0.1")
    assert last is not None and last["connect"]["ok"] and last["token"]["ok"], last
    t.join(timeout=10)
    assert not t.is_alive() and not token.exists() and node.port_free(port)


def test_a_stranger_who_reads_the_greeting_can_neither_stop_the_listener_nor_count(
        tmp_path: Path) -> None:
    """bob connects to alice's listener, reads its greeting and answers with what it said
    (the old `stop NONCE`), then `ok`: the listener keeps serving, alice's node still gets
    through and reads the token, and it learns that someone could not prove the run's key."""
    port, token = free_port(), tmp_path / "token"
    token.write_text("v" * 8)
    spec = {"nonce": "n5", "key": KEY, "expect": 1, "seconds": 30}
    t = threading.Thread(target=node.serve, args=(listening(port), spec, str(token)))
    t.start()
    for answer in ("stop", "ok", "ok \udcff"):
        with socket.create_connection(("127.0.0.1", port), timeout=3) as bob:
            said = bob.recv(128).decode().split()
            bob.sendall(f"{answer} {' '.join(said[1:])}\n".encode(errors="surrogateescape"))
            bob.recv(128)   # it ends bob's connection without a word
    time.sleep(0.3)
    assert t.is_alive() and not node.port_free(port), "bob stopped alice's listener"
    out = node.reach({"addr": "127.0.0.1", "port": port, "nonce": "n5", "key": KEY,
                      "timeout": 3, "token": {"path": str(token), "value": "v" * 8}})
    assert out["connect"] == {"ok": True, "error": None}
    assert out["token"] == {"ok": True, "error": None}
    assert [s["addr"] for s in out["strangers"]] == ["127.0.0.1"] * 3
    assert out["strangers"][0]["said"].startswith("stop n5 ")
    t.join(timeout=10)
    assert not t.is_alive() and node.port_free(port)


def test_a_listener_whose_nodes_do_not_come_is_stopped_by_its_nonce_only() -> None:
    port = free_port()
    spec = {"nonce": "n2", "key": KEY, "expect": 3, "seconds": 30}
    t = threading.Thread(target=node.serve, args=(listening(port), spec, None))
    t.start()
    node.stop_listener(port, "another-nonce", KEY)  # not ours: ignored
    node.stop_listener(port, "n2", "x" * 64)  # without the run's key: ignored
    assert t.is_alive()
    node.stop_listener(port, "n2", KEY)
    t.join(timeout=10)
    assert not t.is_alive() and node.port_free(port)


def test_an_unknown_verb_gets_the_usage(capsys) -> None:
    from orchestrator.node.__main__ import main
    with pytest.raises(SystemExit) as ended:
        main(["launch"])
    assert ended.value.code == 2
    assert "usage: node.py" in capsys.readouterr().err


def test_a_recovery_attempts_run_id_with_a_dot_claims_its_port(leases: str) -> None:
    """A recovery's attempt is RUN.r1: its claim file 29500.alice.RUN.r1 is its own, read
    back as such (the port was found taken for every port of the range when the dot was
    taken for the user's end)."""
    port = free_port()
    found = node.find_port(port, "20261128-033811-5f7949.r1", 200, leases)
    assert found == {"port_free": True, "free_port": port}
    (claim,) = node.live_claims("root", leases)
    assert (claim.port, claim.user, claim.run) == (port, "root", "20261128-033811-5f7949.r1")
