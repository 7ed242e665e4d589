"""`notebook` on the real-site sandbox, as bob (no sudo) through the bastion: JupyterLab on
a node as a run, reached only through an SSH tunnel, its kernel in the cluster's
environment, nothing of it left after Ctrl-C; detached, it outlives the command, `notebook
connect` opens the way again and it ends itself when idle. Real SSH (ProxyJump), a real
JupyterLab and kernel, real nftables between the outsider and the nodes."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import pytest

from ...cluster import ENV, NODE_PYTHON, REPO, ProvisionedCluster, wait_for
from .jupyter import api, execute

pytestmark = [pytest.mark.sandbox, pytest.mark.e2e, pytest.mark.timeout(900)]
URL = re.compile(r"(http://127\.0\.0\.1:\d+)/lab\?token=([A-Za-z0-9_-]+)")
RUN = re.compile(r"run (\d{8}-\d{6}-[0-9a-f]+): ")


def notebook(runs: Path, *args: str) -> subprocess.Popen:
    runs.mkdir(parents=True, exist_ok=True)
    out = open(runs.parent / f"{runs.name}-{time.monotonic_ns()}.out", "w")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "notebook", *args,
                             "--runs-dir", str(runs)], cwd=REPO, env=ENV, stdout=out,
                            stderr=subprocess.STDOUT, text=True)
    proc.out = Path(out.name)   # type: ignore[attr-defined]
    return proc


def said(proc: subprocess.Popen) -> str:
    return proc.out.read_text()   # type: ignore[attr-defined]


def url_of(proc: subprocess.Popen, timeout: float = 240) -> tuple[str, str]:
    """The URL and token the command printed, once it printed them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = URL.search(said(proc))
        if found:
            return found.group(1), found.group(2)
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"no URL printed:\n{said(proc)[-3000:]}")


def run_of(proc: subprocess.Popen) -> str:
    found = RUN.search(said(proc))
    assert found, said(proc)[-3000:]
    return found.group(1)


def interrupt(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    return proc.wait(timeout=90)



def jupyter_processes(cluster: ProvisionedCluster, node: str) -> list[str]:
    """JupyterLab's server and kernels on NODE, as ps shows them to an admin."""
    ps = cluster.exec(node, "ps", "-eo", "user,args", "--no-headers").stdout
    return [line for line in ps.splitlines()
            if "orchestrator.node.notebook" in line or "ipykernel" in line]


def tunnels_here(remote_port: int) -> list[str]:
    """The ssh processes here that forward to REMOTE_PORT (a node's server): from the
    Unix socket of the command's private directory, which relays its local port."""
    ps = subprocess.run(["ps", "-ww", "-eo", "args", "--no-headers"], capture_output=True,
                        text=True).stdout
    return [line for line in ps.splitlines()
            if line.startswith("ssh") and f"tunnel.sock:127.0.0.1:{remote_port}" in line]


def served_on(cluster: ProvisionedCluster, node: str, run_id: str) -> dict:
    """What the notebook's node wrote of it (port, start token, pid): notebook.json."""
    return json.loads(cluster.exec(
        node, "cat", f"/home/bob/.clustertrain/jobs/{run_id}/notebook.json").stdout)


def runs_row(runs: Path, run_id: str) -> str:
    out = subprocess.run([sys.executable, "-m", "orchestrator", "runs", "--runs-dir", str(runs)],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120).stdout
    return next((line for line in out.splitlines() if line.startswith(run_id)), "")


def test_bobs_notebook_on_node1_answers_only_through_ssh_and_ctrl_c_leaves_nothing(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    proc = notebook(runs, "-i", str(sandbox_cluster.inventories["bob"]), "--host", "node1")
    try:
        url, token = url_of(proc)
        run_id = run_of(proc)
        assert "started" in api(url, token, "/api/status")
        # A kernel started through the API runs in the cluster's environment, as bob.
        kernel = api(url, token, "/api/kernels", "POST", {"name": "python3"})["id"]
        printed = execute(url, token, kernel, "import getpass, torch, torch.distributed as "
                          "dist\nprint(torch.__version__, dist.is_available(), "
                          "getpass.getuser())")
        torch = sandbox_cluster.exec("node1", NODE_PYTHON, "-c",
                                     "import torch; print(torch.__version__)").stdout.strip()
        assert printed.split() == [torch, "True", "bob"], printed
        # The server listens on node1's loopback only...
        served = served_on(sandbox_cluster, "node1", run_id)
        assert tunnels_here(served["port"])
        listening = [line.split()[3] for line in sandbox_cluster.exec(
            "node1", "ss", "-ltnH").stdout.splitlines()]
        assert [a for a in listening if a.endswith(f":{served['port']}")] == \
            [f"127.0.0.1:{served['port']}"], listening
        # ... so that not even a node of the cluster (which the firewall lets in) reaches
        # it, and of every port node1 listens on, none but SSH answers the outsider (the
        # sandbox's nodes take SSH from the bastion only: not even that one).
        address = sandbox_cluster.nodes["node1"]

        def answering(source: str, ports: list[int]) -> list[int]:
            """The PORTS of node1 that answer SOURCE (all tried at once, 3 s each)."""
            tries = "".join(f'(timeout 3 bash -c "</dev/tcp/{address}/{p}" 2>/dev/null '
                            f"&& echo {p}) & " for p in ports)
            out = sandbox_cluster.exec(source, "bash", "-c", f"{tries}wait").stdout
            return sorted(int(p) for p in out.split())

        assert answering("node0", [22, served["port"]]) == [22]
        ports = sorted({int(a.rsplit(":", 1)[1]) for a in listening})
        assert answering("outsider0", ports) in ([22], []), ports
        # `runs` lists it as bob's notebook on node1; the token is in no log.
        assert re.match(rf"{run_id}\s+running\s+node1\s.*notebook \(JupyterLab\)",
                        runs_row(runs, run_id)), runs_row(runs, run_id)
        assert jupyter_processes(sandbox_cluster, "node1")
        # It holds node1 as a run does: alice's run there is refused, naming it.
        alice = subprocess.run(
            [sys.executable, "-m", "orchestrator", "train", "-i", str(sandbox_cluster.inventory),
             "--hosts", "node1", "--runs-dir", str(tmp_path / "alice"), "--dry-run"],
            cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
        assert alice.returncode != 0
        assert f"node1 is in use by bob's notebook {run_id}" in alice.stdout + alice.stderr, \
            alice.stdout + alice.stderr
        logs = "".join(p.read_text() for p in (runs / run_id).glob("*.log"))
        assert "lab?token=..." in logs and token not in logs
    finally:
        code = interrupt(proc)
    assert code == 130, said(proc)[-2000:]
    assert "interrupted" in said(proc)
    # The stop's echo (torchrun's traceback) is in the node's log, not on the terminal.
    assert "Traceback" not in said(proc), said(proc)[-3000:]
    wait_for(lambda: not jupyter_processes(sandbox_cluster, "node1")
             and not sandbox_cluster.run_processes("node1", run_id, user="bob"), 60,
             "JupyterLab and its kernel to end on node1")
    assert not tunnels_here(served["port"])


def test_a_detached_notebook_outlives_its_tunnel_connects_again_and_ends_when_idle(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    bob = str(sandbox_cluster.inventories["bob"])
    proc = notebook(runs, "-i", bob, "--host", "node2", "--detach", "--idle", "10")
    url, token = url_of(proc)
    run_id = run_of(proc)
    served = served_on(sandbox_cluster, "node2", run_id)
    assert interrupt(proc) == 0, said(proc)[-2000:]
    assert "tunnel closed, its URL void; the notebook runs on node2" in said(proc)
    assert not tunnels_here(served["port"])
    assert " running " in runs_row(runs, run_id)
    again = notebook(runs, "connect", run_id, "--port", "18999")
    try:
        url2, token2 = url_of(again, timeout=90)
        # A new URL: the token of each connect is its own, and the last one's is void.
        assert url2 == "http://127.0.0.1:18999" and token2 != token
        assert "started" in api(url2, token2, "/api/status")
        with pytest.raises(urllib.error.HTTPError, match="403"):
            api(url2, token, "/api/status")
        # --port that is taken (by this very connect) is named, with the fix.
        taken = notebook(runs, "connect", run_id, "--port", "18999")
        assert taken.wait(timeout=60) != 0
        assert "port 18999 of this machine's loopback is in use" in said(taken) and \
            "choose another with --port" in said(taken), said(taken)
    finally:
        assert interrupt(again) == 0, said(again)[-2000:]
    # Nobody uses it: it ends itself about --idle seconds after the last request (not at
    # JupyterLab's own look, once a minute), and `connect` says so (settled from its node:
    # nobody followed its end).
    wait_for(lambda: not sandbox_cluster.run_processes("node2", run_id, user="bob"), 40,
             "the idle notebook to end by itself within 40 s of --idle 10")
    assert not jupyter_processes(sandbox_cluster, "node2")
    late = notebook(runs, "connect", run_id)
    assert late.wait(timeout=120) == 2, said(late)
    assert f"notebook {run_id} has ended (succeeded)" in said(late), said(late)
    assert " succeeded " in runs_row(runs, run_id)


def test_a_notebook_through_the_queue_is_a_step_of_its_slurm_job(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """bob's `notebook --queue --gpus-per-node 1`: Slurm grants one GPU of a node, and
    JupyterLab runs there as a step of that job (squeue lists the step while it serves:
    Slurm accounts for it and can end it); Ctrl-C ends the server and gives the job back,
    leaving nothing on the node."""
    runs = tmp_path / "runs"
    proc = notebook(runs, "-i", str(sandbox_cluster.inventories["bob"]), "--queue",
                    "--gpus-per-node", "1")
    try:
        url, token = url_of(proc)
        assert "started" in api(url, token, "/api/status")
        info = json.loads((runs / run_of(proc) / "run.json").read_text())
        job, (node,) = info["slurm"]["job_id"], info["slurm"]["nodes"]
        steps = sandbox_cluster.exec("node0", "squeue", "-h", "-s", "-j", job,
                                     "-o", "%i|%j|%N|%u").stdout.split()
        assert f"{job}.0|clustertrain-supervisor|{node}|bob" in steps, steps
        assert jupyter_processes(sandbox_cluster, node)
    finally:
        code = interrupt(proc)
    assert code != 0, said(proc)[-3000:]
    wait_for(lambda: not sandbox_cluster.exec("node0", "squeue", "-h", "-j", job)
             .stdout.strip(), 60, "Slurm to let the notebook's job go")
    assert not jupyter_processes(sandbox_cluster, node), said(proc)[-3000:]
