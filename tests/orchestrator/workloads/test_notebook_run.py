"""`notebook`'s own parts, without a cluster: its run's spec, what it refuses before any
node is touched, where it starts, the tunnel's end here, and `connect` of a run that is no
notebook or has ended. The sandbox test (test_notebook_sandbox.py) runs it for real."""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cluster.inventory import load_cluster
from orchestrator.cluster.ssh import SshTarget
from orchestrator.errors import ClusterError, LaunchError
from orchestrator.node.notebook import TokenKeeper, keep_token
from orchestrator.node.protocol import NOTEBOOK_MODULE
from orchestrator.record.rundir import RunDir
from orchestrator.record.status import cut_short
from orchestrator.record.summary import RunStatus
from orchestrator.run.command import NodeCommand
from orchestrator.run.spec import Given
from orchestrator.workloads.notebook_run import (
    DEFAULT_IDLE,
    PortTaken,
    Relay,
    Served,
    Tunnel,
    hold_local_port,
    least_busy,
    notebook_spec,
    status_through,
    uncordoned,
)

from ...clirun import run_cli as run
from ..local_node import LocalNode


def given(**values) -> dict[str, Given]:
    return {k: Given(v, "--" + k.replace("_", "-")) for k, v in values.items()}




def test_a_notebook_is_one_process_on_one_node_running_jupyterlab_and_no_code(tmp_path) -> None:
    spec = notebook_spec(given(runs_dir=str(tmp_path / "runs"), host="node1"))
    assert (spec.hosts, spec.nodes, spec.script, spec.module) == (("node1",), None,
                                                                   NOTEBOOK_MODULE, True)
    assert (spec.nproc_per_node, spec.hang_timeout, spec.workdir) == (1, 0.0, None)
    assert spec.script_args == () and not spec.detach and spec.run_id
    anywhere = notebook_spec(given(runs_dir=str(tmp_path / "runs")))
    assert (anywhere.hosts, anywhere.nodes) == (None, 1)   # the least busy, or Slurm's
    detached = notebook_spec(given(runs_dir=str(tmp_path / "runs"), detach=True))
    assert detached.script_args == ("--idle", f"{DEFAULT_IDLE:g}")
    queued = notebook_spec(given(runs_dir=str(tmp_path / "runs"), queue=True, gpus_per_node=1,
                                 python_env="mine"))
    assert (queued.queue, queued.gpus_per_node, queued.python_env) == (True, 1, "mine")


@pytest.mark.parametrize("values, words", [
    ({"idle": 60.0}, "--idle goes with --detach"),
    ({"idle": -1.0, "detach": True}, "--idle -1.0: give the seconds without a request"),
    ({"idle": float("nan"), "detach": True}, "--idle nan"),
    ({"gpus_per_node": 1}, "--gpus-per-node goes with --queue"),
    ({"python_env": "../x"}, "--python-env"),
])
def test_what_a_notebook_cannot_be_given_is_refused(tmp_path, values, words) -> None:
    with pytest.raises(ClusterError, match=words.replace("(", r"\(")):
        notebook_spec(given(runs_dir=str(tmp_path / "runs"), **values))


def test_the_command_refuses_a_run_id_where_it_does_not_belong_before_any_node(
        tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    code, out = run(["notebook", "connect", "--runs-dir", str(runs)], capsys)
    assert code == 2 and "notebook connect needs the notebook's run id" in out
    code, out = run(["notebook", "start", "20261127-170914-c2117f", "--runs-dir", str(runs)],
                    capsys)
    assert code == 2 and "a run id goes with connect or stop" in out
    code, out = run(["notebook", "open"], capsys)
    assert code == 2 and "invalid choice: 'open'" in out
    code, out = run(["notebook", "--port", "70000", "--runs-dir", str(runs)], capsys)
    assert code == 2 and "argument --port: 70000: choose a port in 1-65535" in out
    assert not runs.exists()


def recorded(runs: Path, run_id: str, script: str, ended: bool) -> None:
    run = RunDir(runs, run_id)
    info = {"run_id": run_id, "nodes": ["node1"], "script": script, "script_args": [],
            "inventory": "/nowhere.ini", "users": {"node1": "bob"}}
    run.create(info)
    if ended:
        run.write_summary(cut_short(info, RunStatus.INTERRUPTED, time.time(), "Ctrl-C", ()))


def test_connect_names_a_run_that_is_no_notebook_or_has_ended(tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    recorded(runs, "20261127-100000-aaaaaa", "train.py", ended=False)
    recorded(runs, "20261127-100001-bbbbbb", NOTEBOOK_MODULE, ended=True)
    code, out = run(["notebook", "connect", "20261127-100000-aaaaaa", "--runs-dir",
                     str(runs)], capsys)
    assert code == 2 and "is not a notebook (it ran train.py)" in out
    code, out = run(["notebook", "connect", "20261127-100001-bbbbbb", "--runs-dir",
                     str(runs)], capsys)
    assert code == 2 and "has ended (interrupted); start another with `notebook`" in out
    code, out = run(["notebook", "connect", "20261127-100002-cccccc", "--runs-dir",
                     str(runs)], capsys)
    assert code == 2 and "20261127-100002-cccccc" in out


@pytest.fixture
def three(tmp_path):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[train_nodes]\n" + "".join(
        f"node{i} ansible_host=127.0.0.{i + 1}\n" for i in range(3)))
    return load_cluster(inventory)


def test_the_least_busy_node_is_chosen_the_first_among_equals(three) -> None:
    counts = {"node0": 2, "node1": 0, "node2": 0}
    assert least_busy(three, lambda node: counts[node.name]) == "node1"
    assert least_busy(three, lambda node: 0) == "node0"


def test_a_node_that_cannot_be_asked_is_passed_over_and_none_is_an_error(three) -> None:
    def count(node):
        if node.name != "node2":
            raise OSError(f"{node.name}: cannot reach")
        return 3
    assert least_busy(three, count) == "node2"
    with pytest.raises(LaunchError, match="no training node could be asked.*node0: cannot "
                       "reach.*Choose a node with --host"):
        least_busy(three, lambda node: (_ for _ in ()).throw(OSError(f"{node.name}: cannot "
                                                                       "reach")))


def test_the_tunnels_end_here_is_the_first_free_port_held_by_us() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        first = taken.getsockname()[1]
        with hold_local_port(first=first) as held:
            port = held.getsockname()[1]
            assert port != first and port > 0
            assert held.getsockname()[0] == "127.0.0.1"


def bind_elsewhere(port: int) -> str:
    """What another program (another user's, on a shared machine) gets when it binds
    127.0.0.1:PORT with SO_REUSEADDR: 'bound' or the error."""
    code = ("import socket, sys\n"
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "try:\n    s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('bound')\n"
            "except OSError as e:\n    print(e.strerror)\n")
    return subprocess.run([sys.executable, "-c", code, str(port)], capture_output=True,
                          text=True, timeout=30).stdout.strip()


def test_the_port_is_ours_from_the_start_so_nobody_else_can_bind_it() -> None:
    # The race of free_local_port (probe, close, let ssh bind later): between the probe
    # and ssh, another user could take the port and receive the token. Now the port is
    # held by this process, listening, from the start. The port to begin at is one of the
    # kernel's choosing: the default one is any notebook test's, on the other worker too,
    # and could be taken again by it between this one's end and the last look.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        first = probe.getsockname()[1]
    with hold_local_port(first=first) as held:
        port = held.getsockname()[1]
        assert bind_elsewhere(port) == "Address already in use"
    assert bind_elsewhere(port) == "bound"


def test_a_port_asked_for_and_taken_is_named_with_the_fix() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortTaken, match=f"port {port} of this machine's loopback is in "
                           "use .*choose another with --port"):
            hold_local_port(port)


class Answering(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A small HTTP server on a Unix socket: the tunnel's end as ssh makes it."""
    daemon_threads = True


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:   # noqa: N802 - http.server's name
        body = f"hello {self.path}".encode()
        self.send_response(200 if self.headers.get("Authorization") == "token t0k" else 403)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A private directory with a short path (a Unix socket's path is at most 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="nb-", dir="/tmp") as d:
        yield Path(d)


def serve_unix(path: Path) -> Answering:
    server = Answering(str(path), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def get(port: int, path: str, token: str = "t0k") -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_every_connection_to_the_held_port_is_relayed_to_the_tunnels_socket(
        short_tmp: Path) -> None:
    sock = short_tmp / "tunnel.sock"
    with hold_local_port() as held, Relay(held, str(sock)):
        port = held.getsockname()[1]
        # Before ssh made its socket: the connection is closed, the port still ours.
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            get(port, "/early")
        assert bind_elsewhere(port) == "Address already in use"
        server = serve_unix(sock)
        try:
            assert get(port, "/api/status") == (200, "hello /api/status")
            assert get(port, "/lab") == (200, "hello /lab")     # a second one too
            assert get(port, "/lab", token="wrong") == (403, "hello /lab")
            many: list[tuple[int, str]] = []
            threads = [threading.Thread(target=lambda i=i: many.append(get(port, f"/{i}")))
                       for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=30)
            assert sorted(many) == sorted((200, f"hello /{i}") for i in range(8))
        finally:
            server.shutdown()
            server.server_close()


def test_the_readiness_check_goes_to_the_tunnels_socket_not_to_a_port(
        short_tmp: Path) -> None:
    sock = short_tmp / "tunnel.sock"
    assert status_through(str(sock), "t0k") is None   # nothing there yet
    server = serve_unix(sock)
    try:
        assert status_through(str(sock), "t0k") == 200
        assert status_through(str(sock), "other") == 403
    finally:
        server.shutdown()
        server.server_close()
    assert os.stat(short_tmp).st_mode & 0o077 == 0   # private: only we can open it


def test_the_servers_port_and_token_are_read_from_what_the_node_wrote() -> None:
    served = Served.parse("node1", json.dumps({"port": 40001, "token": "t0k", "pid": 7}))
    assert served == Served("node1", 40001, "t0k")


def test_a_cordoned_node_is_not_chosen_and_all_cordoned_is_named(three) -> None:
    assert uncordoned(three, lambda c: {"node0": {"why": "lost"}}).names == ["node1", "node2"]
    def unreadable(cluster):
        raise ClusterError("node0: cannot read the cordon record")
    assert uncordoned(three, unreadable).names == ["node0", "node1", "node2"]
    with pytest.raises(LaunchError, match="every training node is cordoned \\(node0: lost; "
                       "node1: disk; node2: gpu\\); uncordon one"):
        uncordoned(three, lambda c: {"node0": {"why": "lost"}, "node1": {"why": "disk"},
                                     "node2": {"why": "gpu"}})


# ssh's part, as a stand-in (a test double): `-L SOCK:127.0.0.1:PORT` makes the Unix
# socket SOCK and carries each connection to it to PORT (here: this machine's loopback,
# the "node's"), until it is ended.
STAND_IN_SSH = """#!{python}
import socket, sys, threading
sock, _, port = sys.argv[sys.argv.index("-L") + 1].rsplit(":", 2)
def pipe(a, b):
    while True:
        data = a.recv(65536)
        if not data:
            b.shutdown(socket.SHUT_WR)
            return
        b.sendall(data)
def carry(client):
    node = socket.create_connection(("127.0.0.1", int(port)))
    threading.Thread(target=pipe, args=(client, node), daemon=True).start()
    pipe(node, client)
server = socket.socket(socket.AF_UNIX)
server.bind(sock)
server.listen()
while True:
    threading.Thread(target=carry, args=(server.accept()[0],), daemon=True).start()
"""


class Lab(http.server.BaseHTTPRequestHandler):
    """JupyterLab's part, as a stand-in: /api/status answers 200 to the server's token of
    the moment (which the node's real token keeper sets), 403 to any other."""
    token = ""

    def do_GET(self) -> None:   # noqa: N802 - http.server's name
        ok = self.headers.get("Authorization") == f"token {Lab.token}"
        self.send_response(200 if ok else 403)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def test_a_tunnel_prints_a_token_of_its_own_that_dies_with_it(tmp_path, short_tmp) -> None:
    ssh = tmp_path / "ssh"
    ssh.write_text(STAND_IN_SSH.format(python=sys.executable))
    ssh.chmod(0o755)
    lab = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Lab)
    threading.Thread(target=lab.serve_forever, daemon=True).start()
    home, run_id, start = tmp_path / "home", "20261207-050000-abcdef", "s" * 43
    command = NodeCommand(run_id=run_id, node_rank=0, nnodes=1, nproc=1, master_addr="x",
                          master_port=1, torchrun="torchrun", home=str(home),
                          script="orchestrator.node.notebook", node="node1",
                          nodes=("node1",), run_state=str(tmp_path / "state"))
    job = Path(command.job_dir)
    job.mkdir(parents=True)
    (job / "notebook.json").write_text(json.dumps({"port": lab.server_address[1],
                                                   "token": start, "pid": 1}))
    (job / "notebook-access.json").write_text(json.dumps({"token": start}))
    Lab.token = start
    stop = threading.Event()

    def take(token: str) -> bool:
        """The stand-in server's side of a change (set_token's, for the real one)."""
        Lab.token = token
        return True

    threading.Thread(target=keep_token, args=(str(job / "notebook-access.json"),
                                              TokenKeeper(start), take),
                     kwargs={"every": 0.05, "stop": stop}, daemon=True).start()
    lines: list[str] = []
    try:
        with hold_local_port() as held:
            port = held.getsockname()[1]
            with Tunnel(SshTarget(host="node1", ssh_executable=str(ssh)), command,
                        LocalNode(home), held, detached=True, say=lines.append):
                wait_until(lambda: lines, "a line from the tunnel")
                url, token = URL.search(lines[0]).groups()   # type: ignore[union-attr]
                assert url == f"http://127.0.0.1:{port}" and token != start, lines
                assert "works only while this command runs" in lines[0]
                assert get(port, "/api/status", token)[0] == 200
                assert get(port, "/api/status", start)[0] == 403    # the start one: void
                assert bind_elsewhere(port) == "Address already in use"
            # The tunnel has ended: its token is void on the node, the port still ours.
            assert not (job / "notebook-access.json").exists()
            wait_until(lambda: Lab.token not in (token, start), "the token to be voided")
            assert bind_elsewhere(port) == "Address already in use"
    finally:
        stop.set()
        lab.shutdown()
        lab.server_close()


URL = re.compile(r"(http://127\.0\.0\.1:\d+)/lab\?token=([A-Za-z0-9_-]+)")


def wait_until(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.05)
