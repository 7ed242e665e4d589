"""`train`, `stop`, `preflight` against a real 2-node sandbox cluster (real SSH, real
torchrun with gloo across two containers). The kill-a-node test is last: it restarts the
node it killed so that the session's sandbox stays usable."""

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

from ...cluster import ENV as PODMAN_ENV, REPO, ProvisionedCluster as Sandbox

# The timeout covers the session fixture too: preparing nodes takes minutes on a busy machine.
pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1500)]
JOBS = Path(__file__).resolve().parents[1] / "jobs"


class Train:
    """`python -m orchestrator train ...` as a user runs it; stdout lines with their times."""

    def __init__(self, sandbox: Sandbox, runs_dir: Path, *args: str) -> None:
        self.runs_dir = runs_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "train", "-i", str(sandbox.inventory),
             "--workdir", str(JOBS), "--runs-dir", str(runs_dir), *args],
            cwd=REPO, env=PODMAN_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        self.lines: list[tuple[float, str]] = []
        self.stderr = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def wait_for(self, needle: str, count: int = 1, timeout: float = 240) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = [t for t, line in self.lines if needle in line]
            if len(hits) >= count:
                return hits[count - 1]
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.1)
        assert self.proc.stderr is not None
        stderr = self.proc.stderr.read() if self.proc.poll() is not None else ''
        raise AssertionError(f"{needle!r} x{count} not seen; exit {self.proc.poll()}\n"
                             f"{self.text[-4000:]}\n{stderr}")

    def finish(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()
        return code

    def summary(self) -> dict:
        [run] = [p for p in self.runs_dir.iterdir() if p.is_dir()]
        return json.loads((run / "summary.json").read_text())


def assert_no_job_processes(sandbox: Sandbox, nodes=("node0", "node1"), within: float = 0):
    deadline = time.monotonic() + within
    while True:
        left = {n: sandbox.job_processes(n) for n in nodes}
        if not any(left.values()) or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    assert not any(left.values()), f"training processes left behind: {left}"


def test_train_two_nodes_ddp(sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "--nproc-per-node", "2",
              "ddp_allreduce.py", "--", "--steps", "3")
    code = t.finish()
    assert code == 0, t.text[-3000:] + t.stderr
    # The preflight table shows the process count asked for, not the automatic one.
    table = {row.split()[0]: row.split() for row in t.text.splitlines()[:3]}
    assert table["NODE"][6] == "NPROC" and table["node0"][6] == table["node1"][6] == "2", table
    # Every rank of the world, each from the node it ran on, with a correct all_reduce.
    for node, rank in (("node0", 0), ("node0", 1), ("node1", 2), ("node1", 3)):
        assert f"{node}/rank{rank} | rank {rank}/4 host {node} sum 10 ok" in t.text
    summary = t.summary()
    assert summary["status"] == "succeeded"
    assert summary["exit_codes"] == {"node0": 0, "node1": 0}
    assert summary["first_failed"] is None
    assert summary["fingerprint"]["torch"] == "2.13.0+cpu"
    for n in summary["nodes"]:
        assert "sum 10 ok" in Path(n["log"]).read_text()
    assert_no_job_processes(sandbox_cluster)


def test_old_runs_are_pruned_on_the_nodes(sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    """--keep-runs 1: each node keeps the newest run's job directory and code snapshot
    (pruned while the next run's torchrun starts), and the run that follows still works."""
    ids = []
    for i in range(3):
        t = Train(sandbox_cluster, tmp_path / str(i), "--nodes", "2", "--keep-runs", "1",
                  "ddp_allreduce.py", "--", "--steps", "1")
        assert t.finish() == 0, t.text[-3000:] + t.stderr
        ids.append(t.summary()["run_id"])
    home = f"/home/{sandbox_cluster.user}/.clustertrain"
    for node in ("node0", "node1"):
        for sub in ("jobs", "code"):
            left = sandbox_cluster.exec(node, "ls", f"{home}/{sub}").stdout.split()
            assert ids[0] not in left and ids[1] not in left, (node, sub, left)
            assert ids[2] in left, (node, sub, left)


def test_a_launch_that_fails_on_one_node_leaves_nothing_running(sandbox_cluster: Sandbox,
                                                                tmp_path: Path) -> None:
    """node1 cannot create its job directory: the run fails naming node1 and the cause,
    node0, loaded and waiting for the word, never starts torchrun (the launch's two
    phases), and the run's record says failed."""
    user = sandbox_cluster.user
    jobs = f"/home/{user}/.clustertrain/jobs"
    sandbox_cluster.exec("node1", "runuser", "-u", user, "--", "mkdir", "-p", jobs)
    sandbox_cluster.exec("node1", "chmod", "0500", jobs)
    try:
        t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "ddp_allreduce.py", "--",
                  "--sleep", "600")
        code = t.finish(timeout=120)
    finally:
        sandbox_cluster.exec("node1", "chmod", "0700", jobs)
    assert code != 0
    assert "node1: could not start the job" in t.stderr, t.stderr
    assert "Permission denied" in t.stderr and "no node was started" in t.stderr
    summary = t.summary()
    assert summary["status"] == "failed"
    # node0 made its job directory (phase one ran there) and never started torchrun
    started = sandbox_cluster.exec("node0", "ls", "-A",
                                   f"{jobs}/{summary['run_id']}").stdout.split()
    assert "pgid" not in started and "supervisor.pid" not in started, started
    assert_no_job_processes(sandbox_cluster, within=10)


def test_failure_on_node1_stops_node0(sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "fail_on_node.py", "--",
              "--fail-node", "1")
    # node0's rank may end first (its collective broken by node1's): either ends the run.
    failed_at = t.wait_for("torchrun exited with code")
    code = t.finish(timeout=60)
    ended = time.monotonic()
    assert code != 0
    assert ended - failed_at < 10, f"node0 took {ended - failed_at:.1f} s to stop"
    assert "node1 exited with code" in t.stderr and "simulated failure" in t.stderr
    summary = t.summary()
    assert summary["first_failed"] == "node1"
    assert summary["status"] == "failed"
    assert summary["exit_codes"]["node1"] != 0
    assert summary["nodes"][0]["end_reason"] in ("stopped", "peer-failed")
    assert_no_job_processes(sandbox_cluster)


def test_a_rank_that_dies_of_a_signal_shows_its_python_stack(sandbox_cluster: Sandbox,
                                                              tmp_path: Path) -> None:
    """Issue 32: every rank starts with Python's fault handler on. A rank that segfaults
    prints its Python stack into its log (the script's frame named), and the run's error
    names the rank, its node and the signal."""
    t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "fail_on_node.py", "--",
              "--fail-node", "1", "--how", "segv", "--after", "0")
    code = t.finish(timeout=120)
    assert code != 0, t.text
    crash = [line for line in t.text.splitlines() if line.startswith("node1/rank1")]
    assert any("Fatal Python error: Segmentation fault" in line for line in crash), t.text
    assert any(re.search(r'fail_on_node\.py", line \d+ in crash_in_c', line)
               for line in crash), t.text
    assert re.search(r"node1 exited with code \d+ \(rank 1 died of SIGSEGV\)", t.stderr), \
        t.stderr[-3000:]
    assert_no_job_processes(sandbox_cluster)


def test_a_script_that_raises_on_every_rank_fails_at_once_without_recovery(
        sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    """Issue 29: the script's own failure is not a node's: no recovery is attempted,
    however many are allowed."""
    t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "--max-recoveries", "2", "--spares",
              "1", "fail_on_node.py", "--", "--fail-node", "-1", "--how", "raise",
              "--after", "0")
    code = t.finish(timeout=120)
    assert code != 0, t.text
    assert "recovery" not in t.text.replace("(recovery 0)", ""), t.text
    assert "RuntimeError: the script's own error" in t.stderr, t.stderr[-3000:]
    assert t.summary()["status"] == "failed"   # one record: nothing started again
    assert_no_job_processes(sandbox_cluster, nodes=("node0", "node1", "node2"), within=10)


def test_recoveries_used_up_fail_the_run_naming_each_failure(sandbox_cluster: Sandbox,
                                                             tmp_path: Path) -> None:
    """Issue 29: a rank killed by SIGKILL is a node's fault: the run starts again on
    node0 and the spare node2 (CLUSTERTRAIN_RECOVERY=1), where the rank on node rank 1
    dies again; with --max-recoveries 1 the run then fails, naming both failures."""
    t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "--max-recoveries", "1", "--spares",
              "1", "fail_on_node.py", "--", "--fail-node", "1", "--how", "kill")
    code = t.finish(timeout=240)
    assert code != 0, t.text
    assert "joined (recovery 0)" in t.text and "joined (recovery 1)" in t.text, t.text
    assert re.search(r"run (\S+): node1 rank 1 killed \(SIGKILL\); recovery 1 of 1: "
                     r"starting again from the newest checkpoint as \1\.r1 on node0, node2 "
                     r"\(node2, a spare, in node1's place\)", t.text), t.text
    said = re.search(r"error: run (\S+) failed: its node failed 2 time\(s\) and "
                     r"--max-recoveries 1 allowed 1 recovery: \1: node1 rank 1 killed "
                     r"\(SIGKILL\) at \S+; \1\.r1: node2 rank 1 killed \(SIGKILL\) at ",
                     t.stderr)
    assert said, t.stderr[-3000:]
    first = json.loads((tmp_path / said[1] / "summary.json").read_text())
    last = json.loads((tmp_path / f"{said[1]}.r1" / "summary.json").read_text())
    assert first["recovered_in"] == f"{said[1]}.r1" and "cordoned" not in first, first
    assert last["status"] == "failed" and last["first_failed"] == "node2", last
    assert [r["node"] for r in last["recoveries"]] == ["node1"], last["recoveries"]
    assert_no_job_processes(sandbox_cluster, nodes=("node0", "node1", "node2"), within=10)


def test_ctrl_c_leaves_no_process(sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "ddp_allreduce.py", "--",
              "--sleep", "600")
    t.wait_for("sum 3 ok", count=2)
    assert sandbox_cluster.job_processes("node0") and sandbox_cluster.job_processes("node1")
    # the agents are torchrun as the node package runs it (node/torchrun.py), and stop alike
    assert all(any("node.py torchrun --nnodes 2" in p for p in sandbox_cluster.job_processes(n))
               for n in ("node0", "node1"))
    t.proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    code = t.finish(timeout=30)
    assert code == 130
    assert_no_job_processes(sandbox_cluster, within=max(0.0, 10 - (time.monotonic() - sent)))
    assert time.monotonic() - sent < 12
    assert t.summary()["status"] == "interrupted"


def stub_wheel(where: Path, name: str, version: str) -> Path:
    """A wheel of NAME VERSION that holds an empty module: a package 'upgraded by hand'."""
    import zipfile

    path = where / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", "")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                   "Tag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.mark.long
def test_drift_refuses_and_names_package(sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    """On one provisioned node a package is uninstalled and another upgraded by hand: train
    refuses before starting anything, naming the packages, the node and both versions, and
    the command that re-aligns the node; after that command, the same train starts."""
    from ..checks.test_preflight_sandbox import playbook

    venv, node, inventory = "/opt/clustertrain/venv/bin/python", "node2", sandbox_cluster.inventory
    wheel = stub_wheel(tmp_path, "mpmath", "1.4.0")
    subprocess.run(["podman", "cp", str(wheel), f"{sandbox_cluster.containers[node]}:/tmp/"],
                   env=PODMAN_ENV, check=True, capture_output=True)
    fsspec = json.loads(sandbox_cluster.exec("node0", "cat", "/etc/clustertrain/fingerprint.json")
                        .stdout)["packages"]["fsspec"]
    realigned = False
    try:
        sandbox_cluster.exec(node, venv, "-m", "pip", "uninstall", "-y", "-q", "fsspec")
        sandbox_cluster.exec(node, venv, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                             f"/tmp/{wheel.name}")
        t = Train(sandbox_cluster, tmp_path / "runs", "--nodes", "3", "ddp_allreduce.py")
        code = t.finish()
        assert code != 0
        said = t.text + "\n" + t.stderr
        for line in (f"package fsspec: node0={fsspec}, node1={fsspec}, node2=absent",
                     "package mpmath: node0=1.3.0, node1=1.3.0, node2=1.4.0",
                     f"node2 since provisioning: package fsspec: {fsspec} when provisioned, "
                     "absent now",
                     "node2 since provisioning: package mpmath: 1.3.0 when provisioned, 1.4.0 now",
                     f"re-align node2: ansible-playbook site.yml -i {inventory} --limit node2"):
            assert line in said, said
        # Refused before anything started (other users' jobs may run on the nodes meanwhile).
        assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir()), \
            "a run was started despite drift"
        assert "syncing" not in t.text and "starting torchrun" not in t.text
        # Re-align as the message says, with the play of site.yml that owns the environment
        # (playbooks/python_env.yml): the whole site.yml takes minutes here and changes
        # chrony and the firewall on a sandbox others use (tests/packaging runs it).
        site = playbook("playbooks/python_env.yml", "-i", str(inventory), "--limit", node)
        assert site.returncode == 0, site.stdout[-4000:] + site.stderr[-2000:]
        realigned = True
        again = Train(sandbox_cluster, tmp_path / "runs-again", "--nodes", "3",
                      "ddp_allreduce.py", "--", "--steps", "1")
        assert again.finish() == 0, again.text[-3000:] + again.stderr
        assert "DRIFT" not in again.text
    finally:
        if not realigned:  # put the locked packages back (faster than the whole site.yml)
            playbook("playbooks/python_env.yml", "-i", str(inventory), "--limit", node)
        sandbox_cluster.exec(node, "rm", "-f", f"/tmp/{wheel.name}", check=False)


def test_taken_master_port_moves(sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    # Another program listens on the master port. SO_REUSEADDR lets it bind although the
    # previous tests' connections may still sit in TIME_WAIT on that port.
    pidfile = "/tmp/orch-test-listener.pid"
    sandbox_cluster.exec("node0", "sh", "-c",
                          "python3 -c 'import socket,time; s=socket.socket(); "
                          "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                          "s.bind((\"0.0.0.0\", 29500)); s.listen(); time.sleep(600)' "
                          f">/dev/null 2>&1 & echo $! > {pidfile}")
    try:
        deadline = time.monotonic() + 30
        while sandbox_cluster.exec("node0", "python3", "-c", "import socket; "
                                   "socket.create_connection(('127.0.0.1', 29500), 2)",
                                   check=False).returncode != 0:
            assert time.monotonic() < deadline, "the test's listener on node0 did not start"
            time.sleep(0.5)
        t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "ddp_allreduce.py")
        code = t.finish()
    finally:
        sandbox_cluster.exec("node0", "sh", "-c", f"kill $(cat {pidfile})", check=False)
    assert code == 0, t.text[-3000:] + t.stderr
    assert "master port 29500 is in use; using 29501 instead" in t.text
    summary = t.summary()
    assert summary["master"]["port"] == 29501
    assert summary["status"] == "succeeded"


def test_stop_one_of_two_runs(sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    a = Train(sandbox_cluster, tmp_path / "a", "--nodes", "2", "ddp_allreduce.py", "--",
              "--sleep", "600")
    a.wait_for("sum 3 ok", count=2)
    # B shares the nodes knowingly (--share-gpus): without it, preflight refuses nodes
    # that run A uses (tests/orchestrator/checks/test_busy_sandbox.py).
    b = Train(sandbox_cluster, tmp_path / "b", "--nodes", "2", "--share-gpus",
              "ddp_allreduce.py", "--", "--sleep", "600")
    try:
        b.wait_for("sum 3 ok", count=2)
        run_a = next(p.name for p in (tmp_path / "a").iterdir())
        run_b = next(p.name for p in (tmp_path / "b").iterdir())
        ports = {json.loads((tmp_path / d / r / "run.json").read_text())["master"]["port"]
                 for d, r in (("a", run_a), ("b", run_b))}
        assert len(ports) == 2, "the two runs share a master port"
        stop = subprocess.run([sys.executable, "-m", "orchestrator", "stop", run_a,
                               "--runs-dir", str(tmp_path / "a")], cwd=REPO, env=PODMAN_ENV,
                              capture_output=True, text=True, timeout=60)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert a.finish(timeout=30) != 0
        assert a.summary()["status"] == "stopped"
        time.sleep(3)
        assert b.proc.poll() is None, "stopping run A also ended run B"
        for node in ("node0", "node1"):
            procs = sandbox_cluster.job_processes(node)
            assert procs and all(run_a not in p for p in procs)
            assert any(f"--log-dir /home/alice/.clustertrain/jobs/{run_b}/" in p for p in procs)
    finally:
        for run in (a, b):   # whatever failed, no run is left for the next tests
            if run.proc.poll() is None:
                run.proc.send_signal(signal.SIGINT)
            run.finish(timeout=60)
    assert_no_job_processes(sandbox_cluster, within=10)


def test_killed_node_is_noticed(sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "ddp_allreduce.py", "--",
              "--sleep", "600")
    t.wait_for("sum 3 ok", count=2)
    sandbox_cluster.kill("node1")
    try:
        code = t.finish(timeout=60)
        assert code != 0
        assert "node1 lost its connection" in t.stderr
        summary = t.summary()
        assert summary["first_failed"] == "node1"
        assert summary["nodes"][0]["end_reason"] == "stopped"
        assert_no_job_processes(sandbox_cluster, nodes=("node0",))
    finally:
        sandbox_cluster.start("node1")  # back for later tests, SSH answering
        # The run cordoned node1 and drained it in Slurm (tests/e2e/test_cluster.py shows
        # it); an admin returns it, so that later tests find every node idle.
        back = subprocess.run([sys.executable, "-m", "orchestrator", "uncordon", "node1",
                               "-i", str(sandbox_cluster.inventory)], cwd=REPO,
                              env=PODMAN_ENV, capture_output=True, text=True, timeout=60)
    assert back.returncode == 0, back.stdout + back.stderr
    assert "node1 is drained in Slurm" in t.text + t.stderr
