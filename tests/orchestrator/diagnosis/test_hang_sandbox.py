"""A hung run named and stopped, `diagnose` of a healthy run, and a straggler flagged, on
the 3-node sandbox: real SSH through the bastion, torchrun with gloo across three
containers, py-spy from the provisioned environment reading the job user's workers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.record.rundir import RunDir
from orchestrator.record.system import Sample

from ...cluster import ENV as PODMAN_ENV, REPO, ProvisionedCluster as Sandbox
from ..node.test_sysmetrics import SMI_BIN
from ..report.browser import dom, screenshot, series, suspects
from ..run.test_supervision_sandbox import JOBS, cli
from ..run.test_train_sandbox import Train, assert_no_job_processes

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1500)]
NODES = ("node0", "node1", "node2")
JOB = "hang_or_straggle.py"
# The nodes' own PATH, after the nvidia-smi test double's directory (relative: the job's
# working directory on the node is its code snapshot, which carries doubles/).
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_a_stalled_rank_is_named_and_the_run_ends_as_hung(sandbox_cluster: Sandbox,
                                                          tmp_path: Path) -> None:
    """Rank 1 sleeps before an all_reduce that ranks 0 and 2 wait in: with --hang-timeout
    20 the run ends within 90 s, hung, naming rank 1 on node1, with every rank's stack."""
    started = time.monotonic()
    t = Train(sandbox_cluster, tmp_path, "--nodes", "3", "--hang-timeout", "20", JOB, "--",
              "stall", "--rank", "1")
    code = t.finish(timeout=180)
    took = time.monotonic() - started
    assert code == 1, t.text[-3000:] + t.stderr
    assert took < 90, f"the hung run took {took:.0f} s to end"
    summary = t.summary()
    assert summary["status"] == "hung"
    hang = summary["hang"]
    assert [(s["node"], s["rank"]) for s in hang["suspects"]] == [("node1", 1)], hang
    assert hang["suspects"][0]["frame"].startswith("stuck_before_all_reduce")
    assert hang["detected_at"] and hang["quiet_s"] >= 20
    dumps = Path(hang["dumps"])
    assert sorted(p.name for p in dumps.glob("node?-rank?.json")) == [
        "node0-rank0.json", "node1-rank1.json", "node2-rank2.json"]
    report = (dumps / "report.txt").read_text()
    assert ("ranks 0, 2 (node0: 0; node2: 2): in all_reduce, called from "
            "waiting_in_all_reduce") in report, report
    # Each rank's flight recorder, served by its runner: rank 1 is a collective behind.
    assert sorted(p.name for p in dumps.glob("node?-rank?.fr.pkl")) == [
        "node0-rank0.fr.pkl", "node1-rank1.fr.pkl", "node2-rank2.fr.pkl"]
    assert [(s["node"], s["rank"]) for s in hang["flight_recorder"]["suspects"]] == [
        ("node1", 1)], hang["flight_recorder"]
    assert "hung: the run printed nothing (no line, no beat) for" in t.text
    assert "suspect: rank 1 on node1 is in stuck_before_all_reduce" in t.text
    assert "hung: no rank made progress" in t.stderr and "rank 1 on node1" in t.stderr
    # Its report (report.html, written at the end) names the suspect.
    report = tmp_path / summary["run_id"] / "report.html"
    screenshot(report, "sandbox-hung-run")
    assert suspects(dom(report)) == ["node1/1"]
    assert_no_job_processes(sandbox_cluster, NODES, within=15)


def test_a_collective_timeout_dumps_the_survivors_and_names_the_rank_they_waited_for(
        sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    """No hang watch; the process group times out after 10 s instead: ranks 0 and 2 fail
    in all_reduce, and before the run is stopped the ranks still running are dumped:
    rank 1 on node1, in its own code, is named."""
    t = Train(sandbox_cluster, tmp_path, "--nodes", "3", "--hang-timeout", "0", JOB, "--",
              "stall", "--rank", "1", "--timeout", "10")
    code = t.finish(timeout=180)
    assert code == 1, t.text[-3000:] + t.stderr
    summary = t.summary()
    assert summary["status"] == "failed"
    hang = summary["hang"]
    assert hang["trigger"].startswith("collective timeout on node"), hang
    assert [(s["node"], s["rank"]) for s in hang["suspects"]] == [("node1", 1)], hang
    assert hang["suspects"][0]["frame"].startswith("stuck_before_all_reduce")
    assert (Path(hang["dumps"]) / "node1-rank1.json").exists()
    assert "a collective timed out; dumping the ranks still running" in t.text
    assert "A collective timed out; holding it up: rank 1 on node1" in t.stderr
    assert_no_job_processes(sandbox_cluster, NODES, within=15)


def test_a_detached_run_that_hangs_is_found_hung_by_the_nodes(sandbox_cluster: Sandbox,
                                                              tmp_path: Path) -> None:
    """train --detach --hang-timeout 20, and nobody attached: the nodes' supervisors see
    that no node made progress, dump their workers onto the share and stop the run; the
    next `runs` settles it as hung, naming the stalled rank from those dumps."""
    p = cli(sandbox_cluster, tmp_path, "train", "-i", str(sandbox_cluster.inventory),
            "--workdir", str(JOBS), "--detach", "--nodes", "3", "--hang-timeout", "20", JOB,
            "--", "stall", "--rank", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    (run_id,) = [d.name for d in tmp_path.iterdir() if d.is_dir()]
    started, listed = time.monotonic(), ""
    while "hung" not in listed:
        assert time.monotonic() - started < 120, f"not hung after 120 s:\n{listed}"
        time.sleep(5)
        listed = cli(sandbox_cluster, tmp_path, "runs").stdout
    summary = json.loads((tmp_path / run_id / "summary.json").read_text())
    assert summary["status"] == "hung", summary
    hang = summary["hang"]
    assert hang["found_by"] == "the nodes (detached run)" and hang["quiet_s"] >= 20
    assert [(s["node"], s["rank"]) for s in hang["suspects"]] == [("node1", 1)], hang
    assert sorted(p.name for p in Path(hang["dumps"]).glob("node?-rank?.json")) == [
        "node0-rank0.json", "node1-rank1.json", "node2-rank2.json"]
    shown = cli(sandbox_cluster, tmp_path, "runs", "show", run_id).stdout
    assert "hang found at" in shown and "rank 1 on node1" in shown, shown
    assert_no_job_processes(sandbox_cluster, NODES, within=15)


def test_a_mismatched_collective_is_named(sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    """Rank 0 broadcasts while ranks 1 and 2 all_reduce: rank 0 is the odd one out."""
    t = Train(sandbox_cluster, tmp_path, "--nodes", "3", "--hang-timeout", "20", JOB, "--",
              "mismatch")
    code = t.finish(timeout=180)
    assert code == 1, t.text[-3000:] + t.stderr
    summary = t.summary()
    assert summary["status"] == "hung"
    [suspect] = summary["hang"]["suspects"]
    assert (suspect["node"], suspect["rank"]) == ("node0", 0)
    assert "broadcast" in suspect["why"] and "all_reduce" in suspect["why"], suspect
    assert_no_job_processes(sandbox_cluster, NODES, within=15)


def test_diagnose_of_a_healthy_run_names_nobody_and_the_run_finishes(
        sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    t = Train(sandbox_cluster, tmp_path, "--nodes", "3", JOB, "--", "steps", "--steps",
              "250", "--pause", "0.1")
    t.wait_for("started", count=3)
    [run] = [p for p in tmp_path.iterdir() if p.is_dir()]
    out = subprocess.run([sys.executable, "-m", "orchestrator", "diagnose", run.name,
                          "--runs-dir", str(tmp_path)], cwd=REPO, env=PODMAN_ENV,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Hang analysis from py-spy stacks of 3 ranks on 3 nodes: no suspect" in out.stdout
    assert "  suspect: rank" not in out.stdout and "not dumped" not in out.stdout
    [dumps] = list((run / "diagnose").iterdir())
    assert sorted(p.name for p in dumps.glob("node?-rank?.json")) == [
        "node0-rank0.json", "node1-rank1.json", "node2-rank2.json"]
    assert sorted(p.name for p in dumps.glob("node?-rank?.fr.pkl")) == [
        "node0-rank0.fr.pkl", "node1-rank1.fr.pkl", "node2-rank2.fr.pkl"]
    code = t.finish(timeout=300)
    assert code == 0, t.text[-3000:] + t.stderr
    assert t.summary()["status"] == "succeeded"
    assert all(f"rank {r} did its steps" in t.text for r in range(3))
    assert "##clustertrain beat" not in t.text  # beats are read, not shown
    assert "##clustertrain beat" not in (run / "node0.log").read_text()


@pytest.mark.extended
def test_a_cpu_throttled_node_running_a_plain_ddp_script_is_flagged_as_the_straggler(
        sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    """A plain DDP script, one that prints nothing while it trains and knows nothing of
    clustertrain, on 3 nodes; node2's container gets a tenth of a CPU. The worker runner
    times every rank's steps from DDP's own timers: node2's own work per step takes
    several times longer in every window of the run (a minute and more: a straggler is
    named only when it is slower persistently), it alone is flagged, live and in the
    summary, and the others are seen waiting for it. Every node's system metrics are
    charted too (with nvidia-smi's test double on the nodes' PATH: two GPUs at 0 %, each
    flagged idle after --gpu-idle 20 s).
    A tenth, not a quarter: on two cores that the other nodes share with whatever else
    runs (CI's molecule scenarios), node0 and node1 slowed to 0.3 s a step beside node2's
    0.39 s under a quarter, and nobody was named."""
    container = sandbox_cluster.containers["node2"]

    def cpus(n: str) -> None:
        subprocess.run(["podman", "update", "--cpus", n, container], env=PODMAN_ENV,
                       check=True, capture_output=True, timeout=60)

    work = tmp_path / "work"   # the job and nvidia-smi's test double (a GPU at 0 %)
    work.mkdir()
    shutil.copy(JOBS / "plain_ddp.py", work)
    shutil.copytree(SMI_BIN, work / "doubles")
    # About 0.02 s of forward and backward a step on a free core: ten times that under a
    # tenth of a CPU's quota (10 ms of each 100 ms): 300 steps, about 75 s, enough windows
    # to judge. The quota comes once every rank trains: importing torch under it took
    # half a minute more.
    runs = tmp_path / "runs"
    t = Train(sandbox_cluster, runs, "--workdir", str(work), "--nodes", "3",
              "--env", f"PATH=doubles:{NODE_PATH}", "--env", "CUDA_VISIBLE_DEVICES=0,1",
              "--gpu-idle", "20", "plain_ddp.py", "--",
              "--steps", "300", "--batch", "128")
    try:
        t.wait_for("rank 2 training")
        cpus("0.1")
        code = t.finish(timeout=400)
    finally:
        cpus(str(os.cpu_count()))  # `--cpus 0` does not undo a quota here (SANDBOX.md)
    assert code == 0, t.text[-3000:] + t.stderr
    summary = t.summary()
    assert [s["node"] for s in summary["stragglers"]] == ["node2"], summary["stragglers"]
    assert "node2 is " in t.text and "% slower than the median step time" in t.text
    assert "node0 is " not in t.text and "node1 is " not in t.text
    assert "##clustertrain beat" not in t.text   # measured beats are read, not shown
    times = summary["step_times"]
    assert set(times) == set(NODES) and all(times[n]["samples_per_s"] > 0 for n in NODES)
    assert times["node2"]["step_s"] > 1.2 * max(times["node0"]["step_s"],
                                                times["node1"]["step_s"])
    # The others wait for node2 in the gradients' all-reduce; it hardly waits.
    assert min(times["node0"]["wait_s"], times["node1"]["wait_s"]) > 2 * times["node2"]["wait_s"]
    shown = subprocess.run([sys.executable, "-m", "orchestrator", "runs", "show",
                            summary["run_id"], "--runs-dir", str(runs)], cwd=REPO,
                           env=PODMAN_ENV, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[0]: line.split() for line in shown.stdout.splitlines()
            if line.startswith("  node")}
    assert set(rows) == set(NODES) and all(float(rows[n][-1]) > 0 for n in NODES), rows
    assert "  straggler: node2 is " in shown.stdout
    # Its report draws a line per node, node2's marked as the straggler, and the wait.
    report = runs / summary["run_id"] / "report.html"
    screenshot(report, "sandbox-straggler")
    elements = dom(report)
    for chart in ("step", "wait", "rate"):
        lines = series(elements, chart)
        assert set(lines) == set(NODES), (chart, lines.keys())
        assert [n for n, a in lines.items() if "data-mark" in a] == ["node2"]
    # Whatever the script: every node's system metrics, sampled every 10 s by its
    # supervisor, kept in the timeline (not on the terminal nor in the logs) and charted.
    run = RunDir(runs, summary["run_id"])
    assert "@@clustertrain" not in t.text
    assert not any("@@clustertrain" in run.log(n).read_text() for n in NODES)
    samples = run.read_timeline(Sample.from_json)
    for node in NODES:
        mine = [s for s in samples if s.node == node]
        assert len(mine) >= 3, samples
        for s in mine:
            assert s.cpu_pct is not None and 0 <= s.cpu_pct <= 100
            assert s.mem_total and s.mem_available and 0 < s.mem_available < s.mem_total
            assert s.job_rss is not None and s.job_rss > 64 << 20   # torchrun + the rank
            assert s.rx_bps is not None and s.tx_bps is not None    # eth0: the all-reduces
            assert [(g.index, g.util_pct) for g in s.gpus] == [(0, 0.0), (1, 0.0)]
    assert max(s.tx_bps or 0 for s in samples) > 0
    for chart in ("cpu", "memory", "rss", "net-in", "net-out"):
        assert sorted(series(elements, chart)) == sorted(NODES), chart
    assert sorted(series(elements, "gpu-util")) == [f"{n} GPU {i}" for n in sorted(NODES)
                                                    for i in (0, 1)]
    # The double's GPUs do nothing: with --gpu-idle 20 each is flagged once, live, in the
    # summary and in the report.
    gpus = [(n, i) for n in NODES for i in (0, 1)]
    for node, index in gpus:
        assert t.text.count(f"{node} GPU {index} idle (0 % used) for ") == 1, t.text[-3000:]
    flagged = summary["system_flags"]
    assert sorted((f["node"], f["gpu"]) for f in flagged if f["kind"] == "gpu-idle") == gpus
    assert sorted(e.attrs["data-node"] for e in elements
                  if e.attrs.get("data-flag") == "gpu-idle") == sorted(n for n, _ in gpus)
    # ... and `usage` counts them: each node's supervisor adds up its GPUs' idle seconds
    # (the run's two, as CUDA_VISIBLE_DEVICES gives them) into its state on the share.
    states = {n: json.loads((sandbox_cluster.share / "checkpoints" / sandbox_cluster.user /
                             ".clustertrain" / "runs" / summary["run_id"] / f"{n}.json")
                            .read_text()) for n in NODES}
    for node, state in states.items():
        sampled = [s.t for s in samples if s.node == node]
        assert state["gpus"] == 2 and state["gpu_idle_s"] == pytest.approx(
            2 * (max(sampled) - min(sampled)), abs=2 * 11), (node, state, sampled)
    used = subprocess.run([sys.executable, "-m", "orchestrator", "usage", "--runs", "--json",
                           "-i", str(sandbox_cluster.inventory)], cwd=REPO, env=PODMAN_ENV,
                          capture_output=True, text=True, timeout=120)
    assert used.returncode == 0, used.stderr
    (mine,) = [r for r in json.loads(used.stdout)["runs"] if r["run"] == summary["run_id"]]
    idle = sum(s["gpu_idle_s"] for s in states.values()) / 3600
    assert mine["idle_gpu_hours"] == pytest.approx(idle, abs=1e-3), mine
    assert 0 < mine["idle_gpu_hours"] < mine["gpu_hours"], mine
