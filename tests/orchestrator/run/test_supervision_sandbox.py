"""A run never outlives its supervision: the nodes supervise it. Real SSH through the
bastion, real torchrun (gloo) on three containers, real signals to the real CLI."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.node.protocol import PEER_TIMEOUT

from ...cluster import ENV, REPO, ProvisionedCluster

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1500)]
JOBS = Path(__file__).resolve().parents[1] / "jobs"
NODES = ("node0", "node1", "node2")


def cli(cluster: ProvisionedCluster, runs: Path, verb: str, *args: str,
        timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", verb, "--runs-dir",
                           str(runs), *args], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def start(cluster: ProvisionedCluster, runs: Path, *args: str, **kw) -> subprocess.Popen:
    runs.mkdir(parents=True, exist_ok=True)
    out = open(runs / "train.out", "w")
    return subprocess.Popen([sys.executable, "-m", "orchestrator", "train", "-i",
                             str(cluster.inventory), "--runs-dir", str(runs), "--workdir",
                             str(JOBS), *args], cwd=REPO, env=ENV, stdout=out,
                            stderr=subprocess.STDOUT, text=True, **kw)


def text(runs: Path) -> str:
    return (runs / "train.out").read_text()


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None,
             runs: Path | None = None) -> float:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"train exited with {proc.returncode} while waiting for "
                                 f"{what}:\n{text(runs)[-3000:] if runs else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.3)
    return time.monotonic()


def left(cluster: ProvisionedCluster, runs: Path) -> dict[str, list[str]]:
    """The processes of the run recorded in RUNS still alive on each node (supervisor,
    torchrun, workers: every process that carries the run's id in its environment).
    Other jobs on the same nodes do not count."""
    found: dict[str, list[str]] = {}
    for run in [d.name for d in runs.iterdir() if (d / "run.json").exists()]:
        for node in NODES:
            pids = cluster.run_processes(node, run)
            if pids:
                found.setdefault(node, []).extend(pids)
    return found


def runs_status(cluster: ProvisionedCluster, runs: Path) -> str:
    p = cli(cluster, runs, "runs")
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()[1].split()[1]


LONG = ["--nodes", "3", "ddp_allreduce.py", "--", "--steps", "2", "--sleep", "300"]


def test_kill_9_of_train_stops_every_node(sandbox_cluster, tmp_path) -> None:
    """One trial here; bench/kill9_supervision.py repeats it for the rate and the time."""
    proc = start(sandbox_cluster, tmp_path, *LONG)
    try:
        wait_for(lambda: text(tmp_path).count("sum 6 ok") >= 3, 300, "all ranks running",
                 proc, tmp_path)
        proc.kill()
        killed = time.monotonic()
        # The nodes keep the lease RECONNECT_GRACE (15 s) for a controller that connects
        # again, then stop the job (SIGTERM, SIGKILL after 5 s).
        gone = wait_for(lambda: not left(sandbox_cluster, tmp_path), 45,
                        f"no process left after kill -9 (left: {left(sandbox_cluster, tmp_path)})")
    finally:
        proc.kill()
    print(f"kill -9: nothing left after {gone - killed:.1f} s")
    # The record tells the truth the next time anything looks at it.
    assert runs_status(sandbox_cluster, tmp_path) == "controller-lost"
    (summary,) = tmp_path.glob("*/summary.json")
    assert json.loads(summary.read_text())["status"] == "controller-lost"


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_sighup_and_sigterm_act_like_ctrl_c(sandbox_cluster, tmp_path, sig) -> None:
    proc = start(sandbox_cluster, tmp_path, *LONG)
    try:
        wait_for(lambda: text(tmp_path).count("sum 6 ok") >= 3, 300, "all ranks running",
                 proc, tmp_path)
        proc.send_signal(sig)
        sent = time.monotonic()
        wait_for(lambda: not left(sandbox_cluster, tmp_path), 10,
                 f"no process left after {sig.name} (left: {left(sandbox_cluster, tmp_path)})")
        assert proc.wait(timeout=30) == 130
        assert time.monotonic() - sent < 30
    finally:
        proc.kill()
    assert f"interrupted ({sig.name}): stopping the job on every node" in text(tmp_path)
    (summary,) = tmp_path.glob("*/summary.json")
    assert json.loads(summary.read_text())["status"] == "interrupted"
    # torchrun's own traceback at the stop (its SignalException, on every node) stays in
    # the nodes' logs: the terminal has the tool's account of the stop only.
    assert "Traceback" not in text(tmp_path), text(tmp_path)[-3000:]
    logs = [(summary.parent / f"node{i}.log").read_text() for i in range(3)]
    assert any("/torchrun | torch.distributed.elastic.multiprocessing.api.SignalException"
               in log for log in logs), logs


def test_detach_then_attach_follows_to_the_end(sandbox_cluster, tmp_path) -> None:
    t0 = time.monotonic()
    p = cli(sandbox_cluster, tmp_path, "train", "-i", str(sandbox_cluster.inventory),
            "--workdir", str(JOBS), "--detach", "--nodes", "3", "ddp_allreduce.py", "--",
            "--steps", "2", "--sleep", "20")
    assert p.returncode == 0, p.stdout + p.stderr
    returned = time.monotonic() - t0
    (run_id,) = [d.name for d in tmp_path.iterdir() if d.is_dir()]
    assert f"follow it: python -m orchestrator attach {run_id}" in p.stdout
    # The job runs on every node with no controller attached.
    assert set(left(sandbox_cluster, tmp_path)) == set(NODES)
    assert runs_status(sandbox_cluster, tmp_path) == "running"
    a = cli(sandbox_cluster, tmp_path, "attach", run_id)
    assert a.returncode == 0, a.stdout[-3000:] + a.stderr
    for rank, node in enumerate(NODES):  # every rank, prefixed as in train, from the start
        assert f"{node}/rank{rank} | rank {rank}/3 host {node} sum 6 ok" in a.stdout
    assert runs_status(sandbox_cluster, tmp_path) == "succeeded"
    assert not left(sandbox_cluster, tmp_path)
    print(f"train --detach returned after {returned:.1f} s")


def test_detached_run_with_a_failing_node_stops_everywhere(sandbox_cluster, tmp_path) -> None:
    p = cli(sandbox_cluster, tmp_path, "train", "-i", str(sandbox_cluster.inventory),
            "--workdir", str(JOBS), "--detach", "--nodes", "3", "fail_on_node.py", "--",
            "--fail-node", "1", "--after", "8")
    assert p.returncode == 0, p.stdout + p.stderr
    (run_id,) = [d.name for d in tmp_path.iterdir() if d.is_dir()]
    state = next(iter(json.loads((tmp_path / run_id / "run.json").read_text())
                      ["node_commands"].values()))["run_state"]
    host_state = sandbox_cluster.share / Path(state).relative_to("/mnt/cluster")
    failed_at = wait_for(lambda: "exited" in (host_state / "node1.json").read_text()
                         if (host_state / "node1.json").exists() else False, 120,
                         "node1's torchrun to fail")
    stopped = wait_for(lambda: not left(sandbox_cluster, tmp_path), 15,
                       f"every node stopped (left: {left(sandbox_cluster, tmp_path)})")
    print(f"detached failure: every node stopped {stopped - failed_at:.1f} s after node1 failed")
    out = cli(sandbox_cluster, tmp_path, "runs").stdout
    assert "failed (node1)" in out, out
    summary = json.loads((tmp_path / run_id / "summary.json").read_text())
    assert summary["first_failed"] == "node1" and summary["exit_codes"]["node1"] != 0
    assert {n["name"]: (n["end_reason"], n.get("why")) for n in summary["nodes"]} == {
        "node0": ("stopped", "peer-failed node1"), "node1": ("exited", None),
        "node2": ("stopped", "peer-failed node1")}
    # Nobody followed it: its record has each node's whole log, fetched as it was settled.
    logs = cli(sandbox_cluster, tmp_path, "logs", run_id).stdout
    for rank, node in enumerate(NODES):
        assert f"{node}/rank{rank} | rank {rank} on node {rank} joined" in logs, logs
    assert "node1/rank1 | rank 1: simulated failure on node 1 (exit)" in logs, logs
    assert "##clustertrain beat" not in logs and "@@clustertrain" not in logs  # not its words


def test_train_piped_into_head_returns_and_stops_the_job(sandbox_cluster, tmp_path) -> None:
    cmd = (f"{sys.executable} -m orchestrator train -i {sandbox_cluster.inventory} "
           f"--runs-dir {tmp_path} --workdir {JOBS} --nodes 3 ddp_allreduce.py -- --steps 2 "
           "--sleep 300 | head -8")
    p = subprocess.run(["bash", "-c", cmd], cwd=REPO, env=ENV, capture_output=True, text=True,
                       timeout=300)
    # head leaves after 8 lines: the nodes' first lines of output, the job still running.
    assert p.stdout.startswith("NODE") and len(p.stdout.splitlines()) == 8, p.stdout + p.stderr
    wait_for(lambda: not left(sandbox_cluster, tmp_path), 30,
             f"nothing left ({left(sandbox_cluster, tmp_path)})")
    (summary,) = tmp_path.glob("*/summary.json")
    assert json.loads(summary.read_text())["status"] == "interrupted"


def test_a_node_that_dies_while_detached_stops_the_others(sandbox_cluster, tmp_path) -> None:
    """node1 dies (every process of the run there is SIGKILLed at once, its supervisor
    too, as a power cut would end them): the other nodes notice its silence and stop."""
    p = cli(sandbox_cluster, tmp_path, "train", "-i", str(sandbox_cluster.inventory),
            "--workdir", str(JOBS), "--detach", *LONG)
    assert p.returncode == 0, p.stdout + p.stderr
    wait_for(lambda: set(left(sandbox_cluster, tmp_path)) == set(NODES), 120,
             "the job on all nodes")
    sandbox_cluster.exec("node1", "pkill", "-9", "-u", "alice", "-f",
                         "supervisor.py|torchrun|ddp_allreduce")
    died = time.monotonic()
    stopped = wait_for(lambda: not left(sandbox_cluster, tmp_path), 60,
                       f"the others stopped (left: {left(sandbox_cluster, tmp_path)})")
    print(f"node1 died: the others stopped after {stopped - died:.1f} s")
    out = cli(sandbox_cluster, tmp_path, "runs").stdout
    assert "failed (node1)" in out, out


@pytest.mark.long
def test_a_run_survives_its_share_stalling(sandbox_cluster, tmp_path) -> None:
    """Every access to the share blocks, as on an NFS mount whose server stalls, each time
    longer than a peer's timeout (PEER_TIMEOUT, 15 s): 20 s on every node; 20 s again, but
    over on node0 10 s before the others; then 20 s on node1 alone. The nodes' supervisors
    hear each other over the network meanwhile, not through the share: nobody is taken for
    lost, and the run finishes and is reported succeeded. The job sleeps 68 s after its
    first line: the three stalls take 60 s, and it ends a few seconds after the last."""
    assert PEER_TIMEOUT < 20
    train = start(sandbox_cluster, tmp_path, "--nodes", "3", "ddp_allreduce.py", "--",
                  "--steps", "2", "--sleep", "68")
    try:
        # The ranks' own lines ("sum 6 ok"), not the preflight table's "ok" columns: the
        # share stalls while the job runs, not while it starts.
        wait_for(lambda: text(tmp_path).count("sum 6 ok") >= 3, 180, "every rank's first line",
                 train, tmp_path)
        sandbox_cluster.stall_share(20)
        early = threading.Thread(target=sandbox_cluster.stall_share, args=(10, ["node0"]))
        early.start()
        sandbox_cluster.stall_share(20, ["node1", "node2"])
        early.join()
        sandbox_cluster.stall_share(20, ["node1"])
        assert train.poll() is None, text(tmp_path)[-3000:]
        assert train.wait(timeout=180) == 0, text(tmp_path)[-3000:]
    finally:
        if train.poll() is None:
            train.send_signal(signal.SIGINT)
            train.wait(timeout=60)
    assert "succeeded" in text(tmp_path), text(tmp_path)[-3000:]
    assert not left(sandbox_cluster, tmp_path)


BLIP = ("nft add table inet blip; nft add chain inet blip input '{ type filter hook input "
        "priority -10; policy accept; }'; nft add rule inet blip input tcp dport 22 drop")


def test_a_run_survives_a_dropped_ssh_connection(sandbox_cluster, tmp_path) -> None:
    """A network blip: node1 drops every SSH packet for 12 s, so the controller's
    keepalives go unanswered and its connection to node1 ends. train connects again and
    follows node1's log on from the line where it broke: the run succeeds, nobody is taken
    for lost, and every line node1 printed is shown once, in order. The blip is timed on
    node1 itself (one `podman exec` adds the rule, sleeps and deletes it): a loaded machine's
    slow `podman exec` must not stretch it past what train waits for a node (keepalives 8 s,
    then RECONNECT, 10 s). The job ticks for 30 s: the blip ends at about tick 16, and node1
    still prints after train is connected again."""
    train = start(sandbox_cluster, tmp_path, "--nodes", "3", "ddp_allreduce.py", "--",
                  "--steps", "2", "--sleep", "30", "--tick")
    try:
        wait_for(lambda: "node1/rank1 | tick 3" in text(tmp_path), 240, "node1's ticks",
                 train, tmp_path)
        sandbox_cluster.exec("node1", "sh", "-c",
                             f"{BLIP}; sleep 12; nft delete table inet blip")
        assert train.wait(timeout=180) == 0, text(tmp_path)[-3000:]
    finally:
        sandbox_cluster.exec("node1", "nft", "delete", "table", "inet", "blip", check=False)
        if train.poll() is None:
            train.send_signal(signal.SIGINT)
            train.wait(timeout=60)
    out = text(tmp_path)
    assert re.search(r"node1: its SSH connection dropped; connected again after [\d.]+ s",
                     out), out[-3000:]
    ticks = [int(n) for n in re.findall(r"^node1/rank1 \| tick (\d+)$", out, re.M)]
    assert ticks == list(range(len(ticks))) and len(ticks) >= 28, ticks
    assert "succeeded" in out and "lost" not in out, out[-3000:]
    assert not left(sandbox_cluster, tmp_path)


def test_a_node_whose_supervisor_is_stopped_is_named_lost(sandbox_cluster, tmp_path) -> None:
    """node1's supervisor is stopped (SIGSTOP) while its ranks run on: its silence on the
    network names it lost within 20 s, and the others stop; resumed, it stops too."""
    p = cli(sandbox_cluster, tmp_path, "train", "-i", str(sandbox_cluster.inventory),
            "--workdir", str(JOBS), "--detach", *LONG)
    assert p.returncode == 0, p.stdout + p.stderr
    wait_for(lambda: set(left(sandbox_cluster, tmp_path)) == set(NODES), 120,
             "the job on all nodes")
    run = next(d.name for d in tmp_path.iterdir() if (d / "run.json").exists())
    sup = sandbox_cluster.exec("node1", "cat", f"/home/alice/.clustertrain/jobs/{run}/"
                               "supervisor.pid").stdout.strip()
    sandbox_cluster.exec("node1", "kill", "-STOP", sup)
    stopped_at = time.monotonic()
    try:
        others = wait_for(lambda: not any(n in left(sandbox_cluster, tmp_path)
                                          for n in ("node0", "node2")), 40,
                          "node0 and node2 stopped")
        print(f"node1's supervisor stopped: the others stopped after "
              f"{others - stopped_at:.1f} s")
        assert others - stopped_at < 20 + 5   # named lost at 15 s; stopped within the grace
    finally:
        sandbox_cluster.exec("node1", "kill", "-CONT", sup, check=False)
    wait_for(lambda: not left(sandbox_cluster, tmp_path), 60, "node1 stopped too")
    out = cli(sandbox_cluster, tmp_path, "runs").stdout
    assert "failed (node1)" in out, out
