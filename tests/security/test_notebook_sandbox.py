"""bob against alice's notebook, on the real-site sandbox. bob shares alice's login machine
(here: this one) and has a shell of his own on the nodes (`as_user`). Two ways he had in:
(a) the tunnel's local port was probed, closed and bound by ssh later: bob could bind it in
between and receive alice's token; (b) after alice's `notebook connect` ended, bob could
listen on the port her printed URL names, receive the token when she opened the URL again,
and with it reach her server on the node's loopback (and write to her home as her).
Now the command holds its port from its start to its end, and the token it prints is
voided on the node (with every login cookie) when it ends: orchestrator/workloads/notebook_run.py
(hold_local_port, Relay, Access) and orchestrator/node/notebook.py (keep_token)."""

from __future__ import annotations

import http.cookiejar
import json
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from ..cluster import ProvisionedCluster, orchestrator, wait_for
from ..orchestrator.workloads.test_notebook_sandbox import (
    interrupt,
    notebook,
    run_of,
    said,
    url_of,
)
from .conftest import as_user

pytestmark = [pytest.mark.sandbox, pytest.mark.e2e, pytest.mark.timeout(600)]
NODE = "node2"

# bob's request on the node, to alice's server on its loopback: the status it answers.
ASK = """import http.client, json, sys
given = json.loads(sys.stdin.read())
conn = http.client.HTTPConnection("127.0.0.1", given["port"], timeout=20)
conn.request("GET", "/api/status", headers=given["headers"])
print(conn.getresponse().status)
"""


def bob_asks(cluster: ProvisionedCluster, port: int, headers: dict[str, str]) -> int:
    """The HTTP status alice's server (127.0.0.1:PORT of NODE) gives bob, asking there with
    HEADERS (a token, a cookie) from his own shell on the node."""
    stdin = json.dumps({"port": port, "headers": headers}) + "\n"
    said_ = as_user(cluster, NODE, "bob", "python3 -c " + shlex.quote(ASK), stdin=stdin,
                    timeout=60)
    assert said_.returncode == 0, said_.stderr
    return int(said_.stdout.split()[-1])


def bind_elsewhere(port: int) -> str:
    """What another program here gets when it binds 127.0.0.1:PORT (SO_REUSEADDR and
    SO_REUSEPORT set, as bob would try): 'bound' or the error."""
    code = ("import socket, sys\n"
            "s = socket.socket()\n"
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
            "try:\n    s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('bound')\n"
            "except OSError as e:\n    print(e.strerror)\n")
    return subprocess.run([sys.executable, "-c", code, str(port)], capture_output=True,
                          text=True, timeout=30).stdout.strip()


def test_alices_port_is_hers_while_connected_and_her_url_and_cookie_die_with_it(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    alice = str(sandbox_cluster.inventories["alice"])
    proc = notebook(runs, "-i", alice, "--host", NODE, "--detach", "--idle", "600")
    run_id = ""
    try:
        url, token = url_of(proc)
        run_id = run_of(proc)
        local = int(url.rsplit(":", 1)[1])
        served = json.loads(sandbox_cluster.exec(
            NODE, "cat", f"/home/alice/.clustertrain/jobs/{run_id}/notebook.json").stdout)
        assert "works only while this command runs" in said(proc)
        # While it runs, the port is held by alice's command: bob cannot bind it.
        assert bind_elsewhere(local) == "Address already in use"
        # Her browser logs in with the URL; the token and the cookie open her server, even
        # to bob on the node (what a leak of either while it is live would give him).
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        with browser.open(f"{url}/api/status?token={token}", timeout=30) as answer:
            assert answer.status == 200
        cookie = "; ".join(f"{c.name}={c.value}" for c in jar)
        assert cookie, "JupyterLab set no login cookie"
        host = {"Host": f"127.0.0.1:{local}"}
        assert bob_asks(sandbox_cluster, served["port"],
                        {"Authorization": f"token {token}"}) == 200
        assert bob_asks(sandbox_cluster, served["port"], {**host, "Cookie": cookie}) == 200
    finally:
        code = interrupt(proc)
    assert code == 0, said(proc)[-2000:]
    # Her connect has ended: the port is free again, and the token she was shown and her
    # browser's cookie open nothing, wherever they end up (bob's listener, bob's shell).
    assert bind_elsewhere(local) == "bound"
    try:
        wait_for(lambda: bob_asks(sandbox_cluster, served["port"],
                                  {"Authorization": f"token {token}"}) in (401, 403),
                 20, "alice's old token to be refused on the node")
        assert bob_asks(sandbox_cluster, served["port"], {**host, "Cookie": cookie}) \
            in (401, 403)
        # Connecting again gives a new URL; the old one stays dead.
        again = notebook(runs, "connect", run_id)
        try:
            url2, token2 = url_of(again, timeout=120)
            assert token2 != token
            assert bob_asks(sandbox_cluster, served["port"],
                            {"Authorization": f"token {token}"}) in (401, 403)
        finally:
            assert interrupt(again) == 0, said(again)[-2000:]
    finally:
        stop = orchestrator("notebook", "stop", run_id, "-i", alice, "--runs-dir", str(runs))
        assert stop.returncode == 0, stop.stdout + stop.stderr
