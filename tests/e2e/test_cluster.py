"""The test a user runs in their head: provision a fresh cluster, train on it, break
something, see it stopped cleanly, provision again and resume. Real containers, real SSH,
real torchrun across two nodes, the real training job on the generated dataset.

The killed-node tests are last in this file: bringing the node back restarts its container,
and podman rewrites the node's /etc/hosts on a restart, so site.yml runs again there."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from ..cluster import BIN, ENV, REPO, ProvisionedCluster, play_recap, run, wait_for
from ..orchestrator.report.browser import dom, screenshot, series

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox]
# Small and quick on two CPU cores; the generated classes are learnable.
SMALL = ["--width", "8", "--batch-size", "32", "--log-every", "10"]


def train(cluster: ProvisionedCluster, runs: Path, *script_args: str, opts: tuple[str, ...] = (),
          background: bool = False):
    argv = [sys.executable, "-m", "orchestrator", "train", "-i", str(cluster.inventory),
            "--nodes", "2", "--runs-dir", str(runs), *opts, "train.py", "--", *script_args]
    if background:  # output to a file: a pipe nobody reads would stall a chatty job
        out = open(runs / "orchestrator.out", "w")
        return subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=out, stderr=subprocess.STDOUT,
                                text=True)
    return run(*argv, timeout=900)


def summary(runs: Path) -> dict:
    (path,) = runs.glob("*/summary.json")  # exactly one run
    return json.loads(path.read_text())


def fresh_checkpoints(cluster: ProvisionedCluster, run_name: str) -> Path:
    """RUN_NAME's checkpoint directory, emptied: a test that waits for checkpoints must
    not find those of an earlier session on the same sandbox."""
    directory = cluster.checkpoints(run_name)
    shutil.rmtree(directory, ignore_errors=True)
    return directory



def no_training_left(cluster: ProvisionedCluster, nodes=("node0", "node1")) -> bool:
    return all(cluster.job_processes(n) == [] for n in nodes)


def site_yml(cluster: ProvisionedCluster, limit: str) -> dict[str, int]:
    """Run site.yml on the hosts LIMIT; the number of changed tasks per host from its recap."""
    result = run(str(BIN / "ansible-playbook"), "-i", str(cluster.inventory), "site.yml",
                 "--limit", limit)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return {host: counts["changed"] for host, counts in play_recap(result.stdout).items()}


def checkpoints(directory: Path) -> list[Path]:
    """Every file in a run's checkpoint directory, temporary files included."""
    return sorted(directory.iterdir()) if directory.is_dir() else []


def assert_checkpoints_whole(directory: Path) -> None:
    """Every final-named checkpoint loads: nothing half-written under a real name. (A
    writer killed mid-write leaves only a dot-named temporary, which the next run removes.)"""
    import torch

    files = [f for f in checkpoints(directory) if not re.fullmatch(r"\.ckpt-.*\.tmp-\d+", f.name)]
    assert files, f"no checkpoint in {directory}"
    for f in files:
        assert re.fullmatch(r"ckpt-\d{6}-\d{7}\.pt", f.name), f"stray file {f.name}"
        state = torch.load(f, map_location="cpu", weights_only=True)
        assert "model" in state, f"{f.name} holds {sorted(state)}"


def worker_pids(cluster: ProvisionedCluster, node: str) -> list[str]:
    """The training worker processes on NODE (not torchrun, whose command line also
    names train.py); workers start through the runner, `python -u RUNNER train.py`."""
    ps = cluster.exec(node, "ps", "-eo", "pid=,args=").stdout
    return [line.split()[0] for line in ps.splitlines()
            if re.match(r"\s*\d+ \S+/python[\d.]* -u (\S*node\.py worker )?\S*train\.py",
                        line)]


def test_two_nodes_train_the_real_job_well_above_chance(sandbox_cluster, tmp_path):
    result = train(sandbox_cluster, tmp_path, "--epochs", "5", "--run-name", "e2e-learn",
                   "--metrics-json", "/mnt/cluster/checkpoints/alice/results/e2e-learn.json",
                   *SMALL)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    out = result.stdout
    # Every node's lines reach the terminal with their prefix; each rank reports in.
    assert re.search(r"^node0/rank0 \| rank 0/2 .* on node0", out, re.M), out[-3000:]
    assert re.search(r"^node1/rank1 \| rank 1/2 .* on node1", out, re.M), out[-3000:]
    s = summary(tmp_path)
    assert s["status"] == "succeeded"
    assert s["exit_codes"] == {"node0": 0, "node1": 0}
    metrics = json.loads(
        (sandbox_cluster.checkpoints("results") / "e2e-learn.json").read_text())["final"]
    # Ten classes: chance is 10 %. The generated classes are separable by their mean
    # colour pattern, so a few epochs of a real (if tiny) ResNet reach far above it
    # (about 0.85 here); 60 % leaves a margin for seeds while failing a run that did
    # not learn, or one whose ranks trained on the same shard.
    assert metrics["test_acc"] >= 0.6, metrics
    for name in ("node0", "node1"):
        assert (tmp_path / s["run_id"] / f"{name}.log").stat().st_size > 0
    # Its last line points at its report, whose charts have both nodes' lines and the loss
    # the job's beats said, and whose final metrics are the job's.
    report = tmp_path / s["run_id"] / "report.html"
    assert f"(to look at: {report})" in out
    elements = dom(report)
    assert set(series(elements, "step")) == {"node0", "node1"}
    assert set(series(elements, "loss")) == {"loss"}
    assert f"{metrics['test_acc']:.4g}" in report.read_text()


def test_ctrl_c_stops_every_training_process(sandbox_cluster, tmp_path):
    ckpts = fresh_checkpoints(sandbox_cluster, "e2e-ctrlc")
    proc = train(sandbox_cluster, tmp_path, "--epochs", "50", "--run-name", "e2e-ctrlc",
                 "--no-resume", *SMALL, background=True)
    try:
        wait_for(lambda: list(ckpts.glob("*.pt")), 300, "the first epoch's checkpoint")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        stopped = time.monotonic()
        wait_for(lambda: no_training_left(sandbox_cluster), 10, "no training process on any node")
        assert time.monotonic() - stopped < 10
        assert proc.returncode != 0
        assert summary(tmp_path)["status"] == "interrupted"
    finally:
        proc.kill()


def test_resume_after_a_worker_dies_with_max_restarts(sandbox_cluster, tmp_path):
    """A worker killed after two epochs' checkpoints is restarted by torchrun and the run
    resumes from the newest checkpoint. Four epochs, not six: the kill lands in the third
    (an epoch takes about 5 s, the kill about a second), so the restarted worker still
    trains one epoch or more after resuming, which is all the recovery needs."""
    ckpts = fresh_checkpoints(sandbox_cluster, "e2e-resume")
    proc = train(sandbox_cluster, tmp_path, "--epochs", "4", "--run-name", "e2e-resume",
                 "--metrics-json", "/mnt/cluster/checkpoints/alice/results/e2e-resume.json", *SMALL,
                 opts=("--max-restarts", "1", "--rdzv-backend", "c10d"), background=True)
    try:
        wait_for(lambda: len(list(ckpts.glob("*.pt"))) >= 2, 300, "two epoch checkpoints")
        # A worker on node1 dies as if the OOM killer took it (the worker only: torchrun
        # must live on to restart it).
        workers = worker_pids(sandbox_cluster, "node1")
        assert len(workers) == 1, workers
        sandbox_cluster.exec("node1", "kill", "-KILL", workers[0])
        proc.wait(timeout=600)
    finally:
        proc.kill()
    out = (tmp_path / "orchestrator.out").read_text()
    assert proc.returncode == 0, out[-5000:]
    assert "resumed from" in out
    final = json.loads(
        (sandbox_cluster.checkpoints("results") / "e2e-resume.json").read_text())["final"]
    assert final["epochs"] == 4
    assert final["resumed_from"]["epoch"] >= 2, final


def test_node_failure_stops_the_other_node_and_keeps_whole_checkpoints(sandbox_cluster,
                                                                      tmp_path):
    """No restarts allowed: a worker dying on node1 fails the run, node0 is stopped
    at once, nothing keeps running anywhere, and the checkpoints on the share are whole."""
    ckpts = fresh_checkpoints(sandbox_cluster, "e2e-fail")
    proc = train(sandbox_cluster, tmp_path, "--epochs", "50", "--run-name", "e2e-fail",
                 "--no-resume", *SMALL, background=True)
    try:
        wait_for(lambda: list(ckpts.glob("*.pt")), 300, "the first epoch's checkpoint")
        workers = worker_pids(sandbox_cluster, "node1")
        assert len(workers) == 1, workers
        sandbox_cluster.exec("node1", "kill", "-KILL", workers[0])
        killed = time.monotonic()
        proc.wait(timeout=120)
        ended = time.monotonic()
    finally:
        proc.kill()
    out = (tmp_path / "orchestrator.out").read_text()
    assert proc.returncode != 0, out[-3000:]
    # The surviving node is stopped by the orchestrator, not left to time out in gloo.
    assert ended - killed < 60, f"the run took {ended - killed:.0f} s to end"
    assert "node1 exited with code" in out, out[-3000:]
    s = summary(tmp_path)
    assert s["status"] == "failed" and s["first_failed"] == "node1", s
    # Stopped, or ended by itself a moment before, its collectives broken by node1's death.
    assert s["nodes"][0]["end_reason"] in ("stopped", "peer-failed"), s["nodes"]
    wait_for(lambda: no_training_left(sandbox_cluster), 10, "no training process on any node")
    assert_checkpoints_whole(ckpts)


def slurm_state(cluster: ProvisionedCluster, node: str) -> str:
    """sinfo's state and reason of NODE ('drain clustertrain (alice): ...')."""
    return cluster.exec("node0", "sinfo", "-h", "-n", node, "-o", "%t %E").stdout.strip()


def test_a_detached_run_recovers_with_nobody_attached(sandbox_cluster, tmp_path):
    """Issue 29's second acceptance item: the same recovery with the run detached and
    nobody attached. The nodes name the dead node, cordon and drain it, and start the
    next attempt themselves, the spare (its standby) in its place; `attach` afterwards
    shows the recovery, and the record tells the same story as an attached run's."""
    ckpts = fresh_checkpoints(sandbox_cluster, "e2e-detached")
    launched = train(sandbox_cluster, tmp_path, "--epochs", "3", "--run-name", "e2e-detached",
                     "--metrics-json",
                     "/mnt/cluster/checkpoints/alice/results/e2e-detached.json", *SMALL,
                     opts=("--detach", "--max-recoveries", "1", "--spares", "1"))
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-2000:]
    assert "spare(s) standing by: node2" in launched.stdout, launched.stdout[-3000:]
    (run_id,) = [p.name for p in tmp_path.iterdir() if (p / "run.json").exists()]
    states = sandbox_cluster.checkpoints(".clustertrain") / "runs"

    def ended(attempt: str, nodes: tuple[str, ...]) -> bool:
        try:
            return all(json.loads((states / attempt / f"{n}.json").read_text())["state"]
                       == "ended" for n in nodes)
        except (OSError, ValueError, KeyError):
            return False

    try:
        wait_for(lambda: list(ckpts.glob("*.pt")), 300, "the first epoch's checkpoint")
        killed_at = time.time()
        sandbox_cluster.kill("node1")
        # Nobody is attached: the recovery runs to its end on the nodes alone.
        wait_for(lambda: ended(f"{run_id}.r1", ("node0", "node2")), 600,
                 "the recovery's end on node0 and node2")
    finally:
        sandbox_cluster.start("node1")
    attached = run(sys.executable, "-m", "orchestrator", "attach", run_id, "--runs-dir",
                   str(tmp_path), timeout=300)
    out = attached.stdout + attached.stderr
    assert attached.returncode == 0, out[-4000:]
    assert (f"run {run_id}: node1 lost (no word from it for 15 s); its nodes started it "
            f"again as {run_id}.r1 on node0, node2 (node2, a spare, in node1's place)") in out
    assert f"run {run_id}.r1: recovery 1: node1 lost" in out, out[-3000:]
    failed = json.loads((tmp_path / run_id / "summary.json").read_text())
    assert failed["status"] == "failed" and failed["recovered_in"] == f"{run_id}.r1", failed
    done = json.loads((tmp_path / f"{run_id}.r1" / "summary.json").read_text())
    assert done["status"] == "succeeded" and done["recovery_of"] == run_id, done
    (recovery,) = done["recoveries"]
    assert (recovery["node"], recovery["spare"], recovery["cordoned"]) == ("node1", "node2",
                                                                           True), recovery
    assert killed_at < datetime.fromisoformat(recovery["training_again_at"]).timestamp()
    heard = datetime.fromisoformat(recovery["last_heard_at"]).timestamp()
    assert killed_at - 5 < heard < killed_at + 2, (killed_at, recovery)
    assert recovery["down_s"] > 0 and recovery["resumed_from"]["epoch"] >= 1, recovery
    final = json.loads(
        (sandbox_cluster.checkpoints("results") / "e2e-detached.json").read_text())["final"]
    assert final["epochs"] == 3 and final["resumed_from"]["epoch"] == \
        recovery["resumed_from"]["epoch"], final
    assert "resumed from" in (tmp_path / done["run_id"] / "node0.log").read_text()
    assert_checkpoints_whole(ckpts)
    assert re.match(r"drain\*? clustertrain \(alice\): node1 lost mid-run",
                    slurm_state(sandbox_cluster, "node1")), slurm_state(sandbox_cluster, "node1")
    # Nothing is left: no training, and the spare's standby is gone with the run.
    wait_for(lambda: no_training_left(sandbox_cluster, ("node0", "node2")), 10,
             "no training process on node0 and node2")
    assert not sandbox_cluster.exec("node2", "pgrep", "-f", "node.py standby",
                                    check=False).stdout.strip(), "the standby is left"
    # node1 back in service for the tests after this one: started again, it needs nothing
    # of site.yml (a run of it on node1 alone changes nothing: 60 s; the next test runs it,
    # as docs/troubleshooting.md says to), only an admin's uncordon.
    back = run(sys.executable, "-m", "orchestrator", "uncordon", "node1", "-i",
               str(sandbox_cluster.inventory))
    assert back.returncode == 0, back.stdout + back.stderr
    wait_for(lambda: slurm_state(sandbox_cluster, "node1").startswith("idle"), 150,
             "node1 idle in Slurm again")


@pytest.mark.extended
def test_a_killed_node_is_replaced_by_a_spare_and_the_run_resumes(sandbox_cluster, tmp_path):
    """Issue 29's first acceptance item: 2 nodes and a spare, --max-recoveries 1. A node
    vanishes mid-training (its container is killed, as a power cut would): the run starts
    again from its newest whole checkpoint on node0 and the spare, and succeeds; the dead
    node is named, cordoned (every user's preflight refuses it, naming why) and, the
    cluster running Slurm, drained, so that the next allocation goes elsewhere; the record
    tells the story. The node comes back, site.yml on that node alone brings it in line
    again (docs/troubleshooting.md's `--limit NODE`), and an admin returns it (`uncordon`;
    bob may not: on Slurm it is an admin's)."""
    ckpts = fresh_checkpoints(sandbox_cluster, "e2e-killed")   # so no --no-resume: a
    first = tmp_path / "first"                                 # recovery must resume
    first.mkdir()
    proc = train(sandbox_cluster, first, "--epochs", "3", "--run-name", "e2e-killed",
                 "--metrics-json", "/mnt/cluster/checkpoints/alice/results/e2e-killed.json",
                 *SMALL, background=True,
                 opts=("--max-recoveries", "1", "--spares", "1"))
    try:
        wait_for(lambda: list(ckpts.glob("*.pt")), 300, "the first epoch's checkpoint")
        killed_at = time.time()
        sandbox_cluster.kill("node1")
        proc.wait(timeout=600)
    finally:
        proc.kill()
        sandbox_cluster.start("node1")  # back at its address, SSH answering
    out = (first / "orchestrator.out").read_text()
    assert proc.returncode == 0, out[-4000:]
    assert "node1 lost its connection" in out, out[-3000:]
    assert "node1 is cordoned (node1 lost mid-run" in out, out[-3000:]
    assert "node1 is drained in Slurm" in out, out[-3000:]
    (failed,) = [json.loads(p.read_text()) for p in first.glob("*/summary.json")
                 if "recovered_in" in json.loads(p.read_text())]
    assert failed["status"] == "failed" and failed["first_failed"] == "node1", failed
    assert list(failed["cordoned"]) == ["node1"] and list(failed["drained"]) == ["node1"]
    done = json.loads((first / failed["recovered_in"] / "summary.json").read_text())
    assert done["status"] == "succeeded" and done["recovery_of"] == failed["run_id"], done
    assert done["nodes"][0]["name"] == "node0" and done["nodes"][1]["name"] == "node2"
    (recovery,) = done["recoveries"]
    assert (recovery["node"], recovery["spare"], recovery["cordoned"]) == ("node1", "node2",
                                                                           True), recovery
    assert recovery["why"].startswith("lost"), recovery
    # The time from the kill to training again, and its parts.
    assert killed_at < datetime.fromisoformat(recovery["training_again_at"]).timestamp()
    # When the node was last heard (its beats reach its ring successor every second): just
    # before the kill.
    heard = datetime.fromisoformat(recovery["last_heard_at"]).timestamp()
    assert killed_at - 5 < heard < killed_at + 2, (killed_at, recovery)
    assert recovery["silent_s"] > recovery["down_s"], recovery
    assert recovery["down_s"] > 0 and recovery["restart_s"] > 0 and recovery["load_s"] >= 0
    assert recovery["resumed_from"]["epoch"] >= 1, recovery
    # Every attempt's logs are kept, each in its own record.
    assert "resumed from" in (first / done["run_id"] / "node0.log").read_text()
    # Its report draws both attempts on one time axis (node1's line, then node2's), the
    # failure and the training again marked.
    report = first / done["run_id"] / "report.html"
    screenshot(report, "e2e-recovery")
    elements = dom(report)
    assert {e.attrs["data-label"] for e in elements if e.tag == "g" and e.has_class("mark")} \
        == {"node1 failed", "training again"}
    assert set(series(elements, "step")) == {"node0", "node1", "node2"}
    assert (first / failed["run_id"] / "node1.log").exists()
    # The final metrics are those of a run that resumed from that checkpoint.
    final = json.loads(
        (sandbox_cluster.checkpoints("results") / "e2e-killed.json").read_text())["final"]
    assert final["epochs"] == 3 and final["resumed_from"]["epoch"] == \
        recovery["resumed_from"]["epoch"], final
    assert f"run {done['run_id']}: recovery 1: node1 lost" in out, out[-3000:]
    assert_checkpoints_whole(ckpts)
    assert not [f for f in checkpoints(ckpts) if f.name.startswith(".")], "temporaries left"
    wait_for(lambda: no_training_left(sandbox_cluster, ("node0", "node2")), 10,
             "no training process on node0 and node2")
    assert re.match(r"drain\*? clustertrain \(alice\): node1 lost mid-run",
                    slurm_state(sandbox_cluster, "node1")), slurm_state(sandbox_cluster, "node1")

    # The node is back; provisioning it again (docs/troubleshooting.md's `--limit NODE`)
    # touches node1 alone and finds it as provisioned: the power cut lost nothing site.yml
    # keeps (the whole cluster's re-run is tests/packaging/test_installed_sandbox.py's).
    changed = site_yml(sandbox_cluster, "node1")
    assert changed == {"node1": 0}, changed

    # Cordoned: bob's run on node1 (without Slurm's queue) is refused, naming why.
    refused = run(sys.executable, "-m", "orchestrator", "train", "-i",
                  str(sandbox_cluster.inventories["bob"]), "--hosts", "node0,node1",
                  "--dry-run", "--runs-dir", str(tmp_path / "bob"), "train.py")
    assert refused.returncode != 0, refused.stdout[-3000:]
    assert re.search(rf"node1: cordoned since \S+ by alice: node1 lost mid-run "
                     rf"{failed['run_id']} \(.*\); leave it out \(--hosts\), or once it is "
                     r"fixed return it with `python -m orchestrator uncordon node1`",
                     refused.stdout + refused.stderr), refused.stdout + refused.stderr
    # Still drained: the next run through Slurm's queue gets two other nodes.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    queued = train(sandbox_cluster, elsewhere, "--epochs", "1", *SMALL,
                   opts=("--queue", "--gpus-per-node", "1"))
    assert queued.returncode == 0, queued.stdout[-3000:] + queued.stderr[-2000:]
    (info,) = [json.loads(p.read_text()) for p in elsewhere.glob("*/run.json")]
    assert info["slurm"]["nodes"] == ["node0", "node2"], info["slurm"]

    bob = run(sys.executable, "-m", "orchestrator", "uncordon", "node1", "-i",
              str(sandbox_cluster.inventories["bob"]))
    assert bob.returncode != 0 and "only an admin" in bob.stderr, bob.stdout + bob.stderr
    back = run(sys.executable, "-m", "orchestrator", "uncordon", "node1", "-i",
               str(sandbox_cluster.inventory))
    assert back.returncode == 0, back.stdout + back.stderr
    wait_for(lambda: slurm_state(sandbox_cluster, "node1").startswith("idle"), 150,
             "node1 idle in Slurm again")
    listed = run(sys.executable, "-m", "orchestrator", "cordon", "-i",
                 str(sandbox_cluster.inventory))
    assert listed.stdout.strip() == "no node is cordoned", listed.stdout + listed.stderr
    again = run(sys.executable, "-m", "orchestrator", "train", "-i",
                str(sandbox_cluster.inventories["bob"]), "--hosts", "node0,node1",
                "--dry-run", "--runs-dir", str(tmp_path / "bob"), "train.py")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
