"""`python -m orchestrator ui` over a real run on the sandbox cluster: while a two-node
`train` runs, the index shows it running, its page shows its nodes' log lines as they come
and reloads itself, the nodes page names the run holding node0 and node1 (asked over SSH:
the cordon record, Slurm's queue); once the run has ended, its page stops reloading."""

from __future__ import annotations

import http.client
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from ...cluster import ENV as PODMAN_ENV, REPO, ProvisionedCluster as Sandbox
from ..run.test_train_sandbox import Train, assert_no_job_processes

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1500)]
NODES = ("node0", "node1")


def start_train(sandbox: Sandbox, runs: Path) -> Train:
    """A two-node run that prints a line a second on every rank for 20 s."""
    t = Train(sandbox, runs, "--nodes", "2", "ddp_allreduce.py", "--", "--sleep", "20",
              "--tick")
    t.wait_for("tick 2", timeout=240)
    return t


class Ui:
    """`python -m orchestrator ui --port 0` as a user starts it; its printed URL, opened
    once as a browser does (its token is then kept in the cookie the answer sets)."""

    def __init__(self, runs: Path, inventory: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "ui", "--port", "0", "--runs-dir",
             str(runs), "-i", str(inventory)], cwd=REPO, env=PODMAN_ENV,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline()
        assert line.startswith("clustertrain ui: http://127.0.0.1:"), \
            line + (self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.url = urlsplit(line.split(": ", 1)[1].strip())
        self.cookie = ""
        status, _ = self.get(f"/?{self.url.query}")
        assert status == 200 and self.cookie, (status, self.cookie)

    def get(self, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection(self.url.netloc, timeout=120)
        try:
            conn.request("GET", path, headers={"Cookie": self.cookie} if self.cookie else {})
            resp = conn.getresponse()
            self.cookie = (resp.getheader("Set-Cookie") or self.cookie).split(";")[0]
            return resp.status, resp.read().decode("utf-8", errors="replace")
        finally:
            conn.close()

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, err


def ticks(page: str, node: str) -> list[int]:
    """The tick numbers in NODE's log lines as the page shows them."""
    found = re.search(rf'<pre class="log" data-node="{node}">(.*?)</pre>', page, re.S)
    assert found, page[-2000:]
    return [int(n) for n in re.findall(r"\| tick (\d+)", found.group(1))]


def row_of(page: str, attr: str) -> str:
    start = page.index(attr)
    return page[start:page.index("</tr>", start)]


def test_ui_shows_a_live_run_its_logs_and_its_nodes(sandbox_cluster: Sandbox,
                                                     tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    t = start_train(sandbox_cluster, runs)
    ui: Ui | None = None
    try:
        [run_id] = [p.name for p in runs.iterdir() if (p / "run.json").exists()]
        ui = Ui(runs, sandbox_cluster.inventory)

        status, index = ui.get("/")
        assert status == 200 and f'href="/runs/{run_id}/"' in index
        assert ">running<" in row_of(index, f'data-run="{run_id}"'), index[-3000:]

        status, page = ui.get(f"/runs/{run_id}/")
        assert status == 200 and '<meta http-equiv="refresh" content="5">' in page
        first = {n: ticks(page, n) for n in NODES}
        assert all(first.values()), first
        time.sleep(4)
        _, page = ui.get(f"/runs/{run_id}/")
        later = {n: ticks(page, n) for n in NODES}
        for n in NODES:   # new lines of each node, as they came
            assert max(later[n]) > max(first[n]), (n, first[n], later[n])
        status, log = ui.get(f"/runs/{run_id}/node1.log")
        assert status == 200 and "node1/rank" in log and "| tick " in log

        status, nodes = ui.get("/nodes")
        assert status == 200, nodes
        assert "Cannot" not in nodes, nodes[-3000:]   # the cordon record and queue were read
        for n in NODES:
            assert f'<a class="mono" href="/runs/{run_id}/">run {run_id}</a> (alice)' in \
                row_of(nodes, f'<tr data-node="{n}"'), nodes[-3000:]
        assert run_id not in row_of(nodes, '<tr data-node="node2"')
        assert '<pre class="log" id="queue">' in nodes   # the sandbox runs Slurm

        code = t.finish(timeout=240)
        assert code == 0, t.text[-3000:] + t.stderr
        status, page = ui.get(f"/runs/{run_id}/")
        assert status == 200 and 'http-equiv="refresh"' not in page
        assert 'id="status">succeeded<' in page
        assert max(ticks(page, "node0")) >= 15
        _, nodes = ui.get("/nodes")
        assert run_id not in nodes          # it holds no node now
        _, index = ui.get("/")
        assert ">succeeded<" in row_of(index, f'data-run="{run_id}"')

        code, err = ui.stop()
        assert code in (0, 130) and "Traceback" not in err, err
    finally:
        for proc in (t.proc, ui.proc if ui else None):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    assert_no_job_processes(sandbox_cluster, NODES, within=15)
