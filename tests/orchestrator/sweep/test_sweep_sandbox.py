"""`sweep` on the real 3-node sandbox, without Slurm's queue: a 4-trial grid of a job that
prints FINAL_METRICS, one node per trial, so 3 at once on the 3 nodes. Ctrl-C once they
run: every trial stopped on every node and the fourth never started; `sweep resume --detach` then
runs the four again in the background (the three stopped and the one not run), each as a
run of its own; `sweep show` ranks them best first and the sweep's report links each
trial's and draws their losses. (Through Slurm's queue, the 12-trial sweep of
issue 51 is bench/sweep_packing.py.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ...cluster import ENV, REPO, ProvisionedCluster, orchestrator, wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]
JOBS = Path(__file__).resolve().parents[1] / "jobs"


def test_ctrl_c_stops_every_trial_then_resume_runs_the_rest_best_first(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"inventory: {sandbox_cluster.inventory}\nworkdir: {JOBS}\n"
                     "script: sweep_trial.py\nnodes: 1\nargs: [--seconds, '4']\n"
                     "sweep:\n  method: grid\n  parameters:\n    --lr: [0.1, 0.05]\n"
                     "    --width: [8, 4]\n  metric: test_loss\n")
    out = tmp_path / "sweep.out"
    with open(out, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "sweep", "-f",
                                 str(sweep), "--runs-dir", str(runs)], cwd=REPO, env=ENV,
                                stdout=fh, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: out.read_text().count(": started on ") == 3, 120,
                     lambda: f"3 trials to start: {out.read_text()}")
            [sweep_id] = [p.parent.name for p in runs.glob("*/sweep.json")]
            trial_runs = [f"{sweep_id}.t{n}" for n in (1, 2, 3)]
            wait_for(lambda: all(sandbox_cluster.run_processes(n, r)
                                 for n, r in zip(("node0", "node1", "node2"), trial_runs,
                                                 strict=True)), 60,
                     "each trial's run to run on its own node")
            proc.send_signal(signal.SIGINT)
            code = proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
    said = out.read_text()
    assert code == 130, said
    record = json.loads((runs / sweep_id / "sweep.json").read_text())
    assert [t["state"] for t in record["trials"]] == ["stopped"] * 3 + ["not run"], record
    assert not (runs / f"{sweep_id}.t4").exists()
    for node, run in zip(("node0", "node1", "node2"), trial_runs, strict=True):
        assert sandbox_cluster.run_processes(node, run) == [], (node, run)
        assert json.loads((runs / run / "summary.json").read_text())["status"] in (
            "stopped", "interrupted")
    assert f"sweep {sweep_id}: stopped (Ctrl-C): 3 stopped, 1 not run" in said, said

    # Resumed detached: back at once; the sweep goes on in a process of its own.
    started = time.time()
    resumed = orchestrator("sweep", "resume", sweep_id, "--runs-dir", str(runs), "--detach",
                           timeout=60)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-2000:]
    assert f"sweep {sweep_id}: detached (process " in resumed.stdout, resumed.stdout
    assert f"sweep stop {sweep_id} --runs-dir {runs}" in resumed.stdout
    state = runs / sweep_id / "sweep.json"
    wait_for(lambda: json.loads(state.read_text())["state"] == "ended", 300,
             lambda: f"the detached sweep to end: {(runs / sweep_id / 'sweep.log').read_text()}")
    log = (runs / sweep_id / "sweep.log").read_text()
    assert f"sweep {sweep_id}: ended: 4 succeeded; best t4 (--lr 0.05 --width 4): " \
        "test_loss 0.04" in log, log
    for n in (1, 2, 3):   # the stopped ones ran again under new ids; the fourth first
        assert (runs / f"{sweep_id}.t{n}.2" / "summary.json").exists()
    shown = orchestrator("sweep", "show", sweep_id, "--runs-dir", str(runs), "--json")
    trials = json.loads(shown.stdout)["trials"]
    assert [t["number"] for t in trials] == [4, 3, 2, 1], trials   # best first
    assert [t["metric"] for t in trials] == [0.04, 0.08, 0.09, 0.13], trials
    assert all(t["started"] >= started and t["state"] == "succeeded" for t in trials)
    # Its report: the trials best first, each linked to its last run's report, and each
    # trial's loss (its beats') drawn.
    page = (runs / sweep_id / "report.html").read_text()
    order = [page.index(f'data-trial="t{n}"') for n in (4, 3, 2, 1)]
    assert order == sorted(order), order
    for n in (1, 2, 3):
        assert f'href="../{sweep_id}.t{n}.2/report.html"' in page
        assert (runs / f"{sweep_id}.t{n}.2" / "report.html").is_file()
    assert page.count('class="legend"') == 4 and "training loss" in page
