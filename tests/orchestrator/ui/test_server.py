"""`ui`'s web server (orchestrator/ui/server.py), started on a free port in a thread
over a runs directory of recorded runs and asked over real HTTP: the pages, the files of a
run, what it refuses (paths out of the runs directory, requests without the token, on
loopback too). A request carries the server's token (the cookie its page keeps it in, as a
browser that opened the printed URL) unless a test says otherwise."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from orchestrator.cli import main as cli_main
from orchestrator.errors import ClusterError
from orchestrator.record.summary import Summary
from orchestrator.sweep.record import TrialState
from orchestrator.ui.server import UiServer, ask_cluster

from ..report.recorded import write_run

REPO = Path(__file__).resolve().parents[3]
DONE = "20260921-101500-a1b2c3"
LIVE = "20260921-111500-d4e5f6"
SECRET = "TOP-SECRET-6b1f2e: outside the runs directory"
ENV_SECRET = "hf_4c1d0e9a7b-alices-token"   # an --env value in the finished run's run.json


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A runs directory with a finished run and one still running (no summary yet), and
    a secret file beside it, outside it."""
    root = tmp_path / "runs"
    root.mkdir()
    done = write_run(root, DONE, ["node0", "node1"], 120, slow="node1")
    done.create({**done.info(), "spec": {"env": {"HF_TOKEN": ENV_SECRET}}}, queued=True)
    live = write_run(root, LIVE, ["node0", "node1"], 60)
    live.summary_json.unlink()
    live.report_html.unlink()
    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    # ... in a directory that looks like a run too (`/runs/../` must not be taken for one)
    (tmp_path / "run.json").write_text((live.run_json).read_text())
    return root


def serve(runs: Path, **kw) -> Iterator[UiServer]:
    server = UiServer(runs, port=0, **{"host": "127.0.0.1", **kw})
    thread = server.start()
    try:
        yield server
    finally:
        server.close()
        thread.join(timeout=10)
        assert not thread.is_alive()


@pytest.fixture
def ui(runs: Path) -> Iterator[UiServer]:
    yield from serve(runs)


def get(server: UiServer, path: str, headers: dict[str, str] | None = None,
        method: str = "GET", token: bool = True) -> tuple[int, dict[str, str], str]:
    """PATH asked as it is (no client-side normalising of `..` or `%2e`); TOKEN: with the
    server's cookie, as from a browser that opened its URL (HEADERS may replace it)."""
    sent = {"Cookie": f"{server.cookie}={server.token}"} if token else {}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, headers={**sent, **(headers or {})})
        resp = conn.getresponse()
        body = resp.read().decode("utf-8", errors="replace")
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
    finally:
        conn.close()


def test_the_index_lists_the_runs_newest_first_with_links(ui: UiServer) -> None:
    status, headers, body = get(ui, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert f'href="/runs/{DONE}/"' in body and f'href="/runs/{LIVE}/"' in body
    assert body.index(LIVE) < body.index(DONE)   # newest first
    assert "succeeded" in body and "train.py --epochs 30" in body and "alice" in body
    assert '<meta http-equiv="refresh" content="5">' in body


def test_a_runs_page_is_its_report_and_its_logs_are_served(ui: UiServer) -> None:
    status, headers, body = get(ui, f"/runs/{DONE}/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert f"run {DONE}" in body and body.count("<svg") >= 2
    assert 'href="node0.log"' in body and 'http-equiv="refresh"' not in body  # it has ended
    status, headers, body = get(ui, f"/runs/{DONE}/node0.log")
    assert status == 200 and headers["content-type"] == "text/plain; charset=utf-8"
    assert body.startswith("node0/rank0 | epoch 1 step 0 loss 0.5\n") and "FINAL_METRICS" in body
    status, headers, _ = get(ui, f"/runs/{DONE}")
    assert status == 301 and headers["location"] == f"/runs/{DONE}/"
    status, headers, body = get(ui, f"/runs/{DONE}/node0.log", method="HEAD")
    assert status == 200 and body == "" and int(headers["content-length"]) > 1000


def test_a_running_run_shows_running_and_its_page_refreshes(ui: UiServer) -> None:
    _, _, body = get(ui, "/")
    row = body[body.index(f'data-run="{LIVE}"'):]
    row = row[:row.index("</tr>")]
    assert ">running<" in row
    status, _, page = get(ui, f"/runs/{LIVE}/")
    assert status == 200 and '<meta http-equiv="refresh" content="5">' in page
    assert "node1/rank0 | epoch 1 step 39 loss 0.5" in page   # its logs' last lines


def test_a_sweep_is_listed_and_its_page_links_its_trials_runs(tmp_path: Path) -> None:
    from ..sweep.test_report import recorded_sweep

    root = tmp_path / "runs"
    root.mkdir()
    record = recorded_sweep(root)
    (tmp_path / "sweep.json").write_text("{}")   # beside the runs directory: never a sweep
    for server in serve(root):
        _, _, index = get(server, "/")
        row = index[index.index(f'data-sweep="{record.sweep_id}"'):]
        row = row[:row.index("</tr>")]
        assert f'href="/sweeps/{record.sweep_id}/"' in row and "4 of 4 ended" in row
        assert "t3 --lr 0.01 --width 4: test_loss 0.1" in row
        status, _, page = get(server, f"/sweeps/{record.sweep_id}/")
        assert status == 200 and f"sweep {record.sweep_id}" in page
        assert f'href="/runs/{record.sweep_id}.t3/"' in page   # the server's links
        assert 'http-equiv="refresh"' not in page              # it has ended
        status, _, trial = get(server, f"/runs/{record.sweep_id}.t3/")
        assert status == 200 and f"run {record.sweep_id}.t3" in trial
        assert get(server, f"/sweeps/{record.sweep_id}")[1]["location"] == \
            f"/sweeps/{record.sweep_id}/"
        for path in (f"/sweeps/{record.sweep_id}/sweep.json", "/sweeps/../", "/sweeps/..",
                     "/sweeps/%2e%2e/", "/sweeps/20990101-000000-ffffff/", "/sweeps/",
                     f"/sweeps/{record.sweep_id}.t3/"):
            assert get(server, path)[0] == 404, path
        record.trials[0].state = TrialState.RUNNING
        record.save()
        assert '<meta http-equiv="refresh" content="5">' in get(
            server, f"/sweeps/{record.sweep_id}/")[2]   # a trial runs: the page reloads


def test_a_sweep_whose_record_does_not_read_is_named_not_hidden(tmp_path: Path) -> None:
    """A cut-short sweep.json: the index lists the sweep as unreadable, naming the file, and
    its page says why (as `sweep show` does), never a 404 that hides it or a traceback."""
    from ..sweep.test_report import recorded_sweep

    root = tmp_path / "runs"
    root.mkdir()
    record = recorded_sweep(root)
    path = root / record.sweep_id / "sweep.json"
    path.write_text(path.read_text()[:40])
    for server in serve(root):
        _, _, index = get(server, "/")
        row = index[index.index(f'data-sweep="{record.sweep_id}"'):]
        row = row[:row.index("</tr>")]
        assert "unreadable" in row and "is not JSON" in row, row
        status, _, page = get(server, f"/sweeps/{record.sweep_id}/")
        assert status == 422 and str(path) in page and "is not JSON" in page, page
def test_unknown_runs_and_paths_are_not_found(ui: UiServer) -> None:
    for path in ("/runs/20990101-000000-ffffff/", "/runs/", "/runs/nope/x.log",
                 f"/runs/{DONE}/missing.log", "/elsewhere", "/runs/.hidden/"):
        assert get(ui, path)[0] == 404, path
    status, headers, _ = get(ui, "/", method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize("path", [
    "/runs/../../etc/passwd",
    "/runs/%2e%2e/%2e%2e/etc/passwd",
    "/runs/../secret.txt",
    "/runs/%2e%2e/secret.txt",
    "/runs/%2E%2E/secret.txt",
    f"/runs/{DONE}/../../secret.txt",
    f"/runs/{DONE}/%2e%2e/%2e%2e/secret.txt",
    f"/runs/{DONE}/..%2f..%2fsecret.txt",
    f"/runs/{DONE}/%2e%2e%2f%2e%2e%2fsecret.txt",
    f"/runs/{DONE}/..\\..\\secret.txt",
    f"/runs/{DONE}/SECRET_ABS",
    f"/runs/{DONE}/%2fSECRET_ABS",
    f"/runs/{DONE}/%00",
    "/runs/SECRET_ABS",
    "/..%2f..%2fsecret.txt",
])
def test_nothing_outside_the_runs_directory_is_served(ui: UiServer, runs: Path,
                                                      path: str) -> None:
    secret = runs.parent / "secret.txt"
    path = path.replace("SECRET_ABS", str(secret).lstrip("/"))
    status, _, body = get(ui, path)
    assert status in (403, 404), (path, status, body[:300])
    assert SECRET not in body and "root:x:0:0" not in body


def test_symlinks_out_of_the_runs_directory_are_refused(ui: UiServer, runs: Path) -> None:
    secret = runs.parent / "secret.txt"
    (runs / DONE / "leak.log").symlink_to(secret)
    (runs / DONE / "passwd.log").symlink_to("/etc/passwd")
    outside = runs.parent / "outside-run"       # a whole "run" outside, linked in
    outside.mkdir()
    (outside / "run.json").write_text((runs / DONE / "run.json").read_text())
    (outside / "node0.log").write_text(SECRET + "\n")
    (runs / "20260921-121500-0a0b0c").symlink_to(outside, target_is_directory=True)
    (runs / DONE / "other.log").symlink_to(runs / LIVE / "node0.log")   # inside: fine
    for path in (f"/runs/{DONE}/leak.log", f"/runs/{DONE}/passwd.log",
                 "/runs/20260921-121500-0a0b0c/node0.log", "/runs/20260921-121500-0a0b0c/"):
        status, _, body = get(ui, path)
        assert status in (403, 404), (path, status)
        assert SECRET not in body and "root:x:0:0" not in body
    status, _, body = get(ui, f"/runs/{DONE}/other.log")
    assert status == 200 and body.startswith("node0/rank0 | epoch 1")


def test_a_loopback_server_refuses_other_host_names(ui: UiServer) -> None:
    assert ui.url == f"http://127.0.0.1:{ui.port}/?token={ui.token}"
    assert get(ui, "/", {"Host": f"localhost:{ui.port}"})[0] == 200
    # A page of another site whose name was pointed at 127.0.0.1 (DNS rebinding), even
    # with the token's cookie.
    status, _, body = get(ui, "/", {"Host": f"attacker.example:{ui.port}"})
    assert status == 403 and DONE not in body


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_every_server_asks_for_its_token_on_loopback_too(runs: Path, host: str) -> None:
    """Another user of the machine reaches its loopback as well as its owner does: without
    the token nothing of a run is answered, only what to do; the printed URL's token is
    kept in a cookie, which then lets the page's links work."""
    for server in serve(runs, host=host):
        token = server.token
        assert token and len(token) >= 32 and server.url.endswith(f"/?token={token}")
        for path in ("/", f"/runs/{DONE}/", f"/runs/{DONE}/node0.log",
                     f"/runs/{DONE}/run.json", f"/runs/{DONE}/report.html", "/nodes"):
            for method in ("GET", "HEAD"):
                status, headers, body = get(server, path, method=method, token=False)
                assert status == 403, (path, method)
                assert "set-cookie" not in headers
                for leak in (DONE, LIVE, ENV_SECRET, "epoch", "alice", "node0"):
                    assert leak not in body, (path, leak)
        status, _, body = get(server, "/", token=False)
        assert "open the URL `ui` printed" in body and "?token=" in body
        for wrong in ("?token=", "?token=x", f"?token={token[:-1]}", f"?token={token}x"):
            assert get(server, "/" + wrong, token=False)[0] == 403, wrong
        for cookie in (f"{server.cookie}=nope", f"clustertrain_ui={token}",
                       f"{server.cookie}x={token}"):
            assert get(server, "/", {"Cookie": cookie}, token=False)[0] == 403, cookie
        status, headers, body = get(server, f"/?token={token}", token=False)
        assert status == 200 and f'href="/runs/{DONE}/"' in body
        cookie = headers["set-cookie"]
        assert cookie.startswith(f"{server.cookie}={token};")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        # The cookie alone lets the page's links work.
        jar = {"Cookie": f"{server.cookie}={token}"}
        status, _, body = get(server, f"/runs/{DONE}/node0.log", jar, token=False)
        assert status == 200 and body.startswith("node0/rank0 | epoch")
        status, _, body = get(server, f"/runs/{DONE}/run.json", jar, token=False)
        assert status == 200 and ENV_SECRET in body    # its owner sees it all


def test_two_servers_each_take_their_own_token_only(runs: Path) -> None:
    """Two `ui`s of one browser (other ports on one host name) keep a cookie each: neither
    takes the other's token, and opening one does not log out of the other."""
    for first in serve(runs):
        for second in serve(runs):
            assert first.token != second.token and first.cookie != second.cookie
            both = {"Cookie": f"{first.cookie}={first.token}; "
                              f"{second.cookie}={second.token}"}
            assert get(first, "/", both, token=False)[0] == 200
            assert get(second, "/", both, token=False)[0] == 200
            assert get(second, f"/?token={first.token}", token=False)[0] == 403
            swapped = {"Cookie": f"{second.cookie}={first.token}"}
            assert get(second, "/", swapped, token=False)[0] == 403


def test_the_nodes_page_without_an_inventory_says_to_pass_it(ui: UiServer) -> None:
    status, _, body = get(ui, "/nodes")
    assert status == 200 and "pass <code>-i</code>" in body


def test_a_cluster_that_does_not_answer_is_said_on_the_nodes_page(runs: Path,
                                                                  tmp_path: Path) -> None:
    """Nodes nobody answers on (a closed port): the page names the nodes, the runs that
    hold them (from the runs directory) and the error; the cluster is asked once for
    requests that follow each other closely."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  vars:\n    ansible_user: nobody\n    ansible_port: 1\n"
        "    ansible_ssh_common_args: -o ConnectTimeout=5 -o BatchMode=yes\n"
        "  children:\n    cluster:\n      children:\n        train_nodes:\n          hosts:\n"
        "            node0: {ansible_host: 127.0.0.1}\n"
        "            node1: {ansible_host: 127.0.0.2}\n"
        "            node2: {ansible_host: 127.0.0.3}\n")
    asked: list[float] = []

    def query() -> dict:
        asked.append(time.monotonic())
        return ask_cluster(inventory)

    for server in serve(runs, cluster=query):
        status, _, body = get(server, "/nodes")
        assert status == 200, body
        assert "Cannot read the cordon record" in body, body
        for node in ("node0", "node1"):
            row = body[body.index(f'<tr data-node="{node}"'):]
            assert f'href="/runs/{LIVE}/">run {LIVE}</a> (alice)' in row[:row.index("</tr>")]
        row = body[body.index('<tr data-node="node2"'):]
        assert "run " not in row[:row.index("</tr>")]
        assert DONE not in body      # an ended run holds nothing
        assert get(server, "/nodes")[0] == 200
        assert len(asked) == 1


def test_a_cluster_query_that_raises_is_said_not_a_server_error(runs: Path,
                                                                tmp_path: Path) -> None:
    missing = tmp_path / "no-such-inventory.yml"
    for server in serve(runs, cluster=lambda: ask_cluster(missing)):
        status, _, body = get(server, "/nodes")
        assert status == 200 and "Cannot ask the cluster:" in body
        assert str(missing) in body
        # What the runs directory knows is shown all the same.
        assert f'<p data-node="node0">node0: <a class="mono" href="/runs/{LIVE}/">' in body


def test_a_port_in_use_and_a_runs_dir_that_is_not_one_are_clear_errors(
        ui: UiServer, runs: Path, tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=f"port {ui.port} on 127.0.0.1 is in use.*--port 0"):
        UiServer(runs, port=ui.port)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ClusterError, match="not a directory"):
        UiServer(tmp_path / "a-file", port=0)


def test_the_cli_says_a_bad_runs_dir(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # Refused at the door, by the option's own type (cli/values.py), before it serves.
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit) as refused:
        cli_main(["ui", "--runs-dir", str(tmp_path / "a-file"), "--port", "0"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert f"--runs-dir: {tmp_path / 'a-file'} is not a directory; give the directory " \
        "the runs are recorded in" in err, err


def test_a_new_user_without_runs_gets_an_empty_list(tmp_path: Path) -> None:
    server = UiServer(tmp_path / "runs", port=0)   # no run recorded yet: no directory
    server.start()
    try:
        with urllib.request.urlopen(server.url, timeout=10) as answer:
            assert answer.status == 200 and "No runs yet" in answer.read().decode()
    finally:
        server.close()


def test_the_cli_serves_until_ctrl_c(runs: Path) -> None:
    # Ctrl-C as a terminal sends it: to a `ui` whose SIGINT is not ignored (a test suite
    # started in the background, as a script's `&` does, would pass its SIG_IGN on).
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "ui", "--port", "0",
                             "--runs-dir", str(runs)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("clustertrain ui: http://127.0.0.1:"), line
        url = urlsplit(line.split(": ", 1)[1].strip())
        token = parse_qs(url.query)["token"][0]
        note = proc.stdout.readline() + proc.stdout.readline()
        assert "other users of this machine reach it too" in note and "Ctrl-C" in note, note
        for path, status in (("/", 403), (f"/?{url.query}", 200)):
            conn = http.client.HTTPConnection(url.netloc, timeout=30)
            conn.request("GET", path)
            resp = conn.getresponse()
            assert resp.status == status and (DONE in resp.read().decode()) == (status == 200)
            conn.close()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 130) and "Traceback" not in err, err
    assert token not in note + out + err     # printed in the URL line only


def test_a_record_that_cannot_be_read_is_named_on_its_page_and_in_the_list(
        tmp_path: Path) -> None:
    """Corrupt records (a run.json that is a list, a summary whose duration is text, one
    cut short) are said, each naming its file and what to do: the index still lists
    every run, and a run's page is the reason, never a server error."""
    root = tmp_path / "runs"
    write_run(root, DONE, ["node0", "node1"], 120)
    broken = {"20260921-121500-0a0a0a": ("run.json", "[]"),
              "20260921-131500-0b0b0b": ("summary.json", None),
              "20260921-141500-0c0c0c": ("summary.json", '{"status": "succ')}
    for run_id, (name, text) in broken.items():
        run = write_run(root, run_id, ["node0"], 60)
        if text is None:
            text = (run.path / name).read_text().replace('"duration_s": 60.0',
                                                         '"duration_s": "a minute"')
        (run.path / name).write_text(text)
    for server in serve(root):
        status, _, body = get(server, "/")
        assert status == 200, body
        assert f'href="/runs/{DONE}/"' in body and "succeeded" in body
        for run_id, (name, _) in broken.items():
            row = body[body.index(f'data-run="{run_id}"'):]
            assert ">unreadable<" in row[:row.index("</tr>")], run_id
            status, _, page = get(server, f"/runs/{run_id}/")
            assert status != 500 and str(root / run_id / name) in page, page
            assert "fix" in page and "Traceback" not in page, page


def test_the_web_view_and_sweep_show_agree_on_a_sweep_whose_process_was_killed(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The sweep's record says running; its process was killed (here: one that ended).
    The index, its page and `sweep show` all say stopped, "its process is gone", with the
    same trials: its first trial's run failed, its second still has no summary (its train
    is a process of its own), the others never started."""
    import json
    import socket

    from orchestrator.record.rundir import RunDir
    from orchestrator.sweep.record import open_sweep

    from ..sweep.test_report import recorded_sweep

    root = tmp_path / "runs"
    root.mkdir()
    record = recorded_sweep(root)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    record.host, record.pid, record.state = socket.gethostname(), int(gone.stdout), "running"
    for t in record.trials:
        t.state, t.metric = TrialState.PENDING, None
    for t in record.trials[:2]:
        t.state = TrialState.RUNNING
    RunDir(root, record.trials[0].run_id or "").write_summary(Summary.from_json({"status": "failed",
                                                               "duration_s": 3.0}))
    (root / (record.trials[1].run_id or "") / "summary.json").unlink(missing_ok=True)
    record.save()
    for server in serve(root):
        _, _, index = get(server, "/")
        row = index[index.index(f'data-sweep="{record.sweep_id}"'):]
        assert ">stopped<" in row[:row.index("</tr>")], row[:row.index("</tr>")]
        _, _, page = get(server, f"/sweeps/{record.sweep_id}/")
        assert f"<title>sweep {record.sweep_id}: stopped</title>" in page
    assert cli_main(["sweep", "show", record.sweep_id, "--runs-dir", str(root),
                     "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["state"], shown["why"]) == ("stopped", "its process is gone")
    assert sorted(t["state"] for t in shown["trials"]) == [
        "failed", "not run", "not run", "running"]
    kept = open_sweep(root, record.sweep_id)
    assert sorted(t.state.value for t in kept.trials) == sorted(
        t["state"] for t in shown["trials"])
