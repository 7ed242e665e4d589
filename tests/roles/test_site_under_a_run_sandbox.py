"""The admin's routine re-provisioning while a run goes on, on the shared cluster: a whole
site.yml as the sudo user (alice), with a new environment file and a change for every role
that reloads something (sshd, chrony, the firewall, the NFS export, Slurm, the health
timer), while a queued 3-node job (Slurm's steps) talks to its peers every second. The job
runs on untouched to its end: its connections survive the firewall's reload, the
controller's SSH sessions sshd's, the share stays mounted through nfs-ganesha's restart,
Slurm's restarts do not end it, and it keeps the environment state it started in (its
packages, and a module it imports late). The next run gets the new state, and the old one
is removed once no process runs from it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ..cluster import REPO, ProvisionedCluster, orchestrator, play_recap
from ..orchestrator.checks.test_preflight_sandbox import playbook
from ..orchestrator.run.test_train_sandbox import Train

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1500)]
NODES = ("node0", "node1", "node2")
# Talks to its peers every second until DONE exists, then says whether the packages it
# sees are those it started with, and imports a module of the environment it started in.
JOB = """\
import importlib.metadata as md, os, sys, time
import torch, torch.distributed as dist

def packages():
    return sorted(f"{d.metadata['Name']}=={d.version}" for d in md.distributions())

dist.init_process_group("gloo")
start = packages()
print("start", sys.prefix, len(start), flush=True)
flag = torch.zeros(1)
while not flag.item():
    flag.fill_(float(dist.get_rank() == 0 and os.path.exists(sys.argv[1])))
    dist.all_reduce(flag)
    time.sleep(1)
same = "same packages" if packages() == start else "packages changed"
import jupyter_server   # imported late, as an evaluation or a final save might
print("end", sys.prefix, same, "late import ok", flush=True)
dist.destroy_process_group()
"""
PROBE = """\
import importlib.util, sys
print("prefix", sys.prefix, "jupyter_server",
      "present" if importlib.util.find_spec("jupyter_server") else "absent", flush=True)
"""


def slurm_job(run: Train) -> str:
    """The Slurm job id a queued run said it got."""
    for _, line in run.lines:
        found = re.search(r"Slurm job (\d+)", line)
        if found:
            return found.group(1)
    raise AssertionError(f"no Slurm job named:\n{run.text[-3000:]}")


def current(cluster: ProvisionedCluster, node: str = "node0") -> str:
    return json.loads(cluster.exec(node, "cat", "/etc/clustertrain/python_env.json")
                      .stdout)["prefix"]


@pytest.mark.extended
def test_site_yml_with_every_role_changed_leaves_a_running_job_untouched(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    before = current(sandbox_cluster)
    assert re.fullmatch(r"/opt/clustertrain/envs/[0-9a-f]{12}/venv", before), before
    # The new environment file: the project's without JupyterLab, and its wheelhouse.
    changed = tmp_path / "environment.yml"
    changed.write_text("".join(line for line in (REPO / "environment.yml").read_text()
                               .splitlines(keepends=True) if "- jupyterlab==" not in line))
    wheelhouse = sandbox_cluster.share / "wheelhouse-nojupyter"
    built = orchestrator("wheelhouse", "--env", str(changed), "--dest", str(wheelhouse))
    assert built.returncode == 0, built.stdout + built.stderr
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    (work / "probe.py").write_text(PROBE)
    mine = sandbox_cluster.checkpoints(tmp_path.name)
    mine.mkdir(parents=True, exist_ok=True)
    # keep 1: the state the run uses is the only old one, and must stay while it runs. The
    # rest: what an admin changes on a working day, one per role that reloads a service.
    routine = tmp_path / "routine.yml"
    routine.write_text(yaml.safe_dump({
        "python_env_file": str(changed), "python_env_keep": 1,
        "python_env_wheelhouse": "/mnt/cluster/wheelhouse-nojupyter",
        "common_ssh_extra_settings": {"ClientAliveInterval": 120},
        "common_time_maxpoll": 7,
        "firewall_extra_rules": [{"port": 9100, "sources": ["192.0.2.0/24"],
                                  "comment": "the monitoring host's scrapes"}],
        "nfs_server_extra_clients": ["192.0.2.10"],      # a workstation (TEST-NET-1)
        "slurm_conf_extra": {"PriorityCalcPeriod": 1, "MessageTimeout": 20},
        "health_interval": "2d"}))
    run = Train(sandbox_cluster, tmp_path / "runs", "--workdir", str(work), "--queue",
                "--nodes", "3", "--gpus-per-node", "1", "job.py", "--",
                f"/mnt/cluster/checkpoints/alice/{tmp_path.name}/done")
    try:
        run.wait_for(f"start {before} ", count=3)
        job = slurm_job(run)
        play = playbook("site.yml", "-i", str(sandbox_cluster.inventory), "-e", f"@{routine}")
        assert play.returncode == 0, play.stdout[-4000:] + play.stderr[-2000:]
        assert all(c["changed"] > 0 for h, c in play_recap(play.stdout).items()
                   if h in NODES), play.stdout[-4000:]
        for done in ("Reload the sshd service", "Restart chrony", "Load the new ruleset",
                     "Restart nfs-ganesha", "Restart slurmctld", "Restart slurmd",
                     "Restart the timer", "Kept while processes run from them"):
            assert done in play.stdout, f"{done!r} not done:\n{play.stdout[-4000:]}"
        assert run.proc.poll() is None, run.text[-4000:]
        steps = sandbox_cluster.exec("node0", "squeue", "-h", "-j", job, "-o", "%T").stdout
        assert steps.strip() == "RUNNING", steps
        after = current(sandbox_cluster)
        assert after != before and {current(sandbox_cluster, n) for n in NODES} == {after}
        (mine / "done").touch()
        assert run.finish(timeout=300) == 0, run.text[-4000:] + run.stderr
        assert "its SSH connection dropped" not in run.text, run.text[-4000:]
        for rank, node in enumerate(NODES):
            assert f"{node}/rank{rank} | end {before} same packages late import ok" \
                in run.text, run.text[-4000:]
        assert run.summary()["env_prefix"] == before

        # The next run gets the new state: no JupyterLab there.
        probe = Train(sandbox_cluster, tmp_path / "probe", "--workdir", str(work),
                      "--nodes", "3", "probe.py")
        assert probe.finish() == 0, probe.text[-3000:] + probe.stderr
        for rank, node in enumerate(NODES):
            assert f"{node}/rank{rank} | prefix {after} jupyter_server absent" in probe.text
        assert probe.summary()["env_prefix"] == after
        assert sandbox_cluster.exec("node1", "test", "-d", str(Path(before).parent),
                                    check=False).returncode == 0   # kept while it ran
    finally:
        if run.proc.poll() is None:   # a failed assertion: the job ends as it would
            (mine / "done").touch()
            try:
                run.finish(timeout=120)
            except subprocess.TimeoutExpired:
                run.proc.terminate()
                run.finish(timeout=120)
        # Back to the inventory's settings and the project's environment, whose state is
        # there: nothing to install, and with keep 1 the other state goes, nothing running
        # from it now.
        back = playbook("site.yml", "-i", str(sandbox_cluster.inventory),
                        "-e", "python_env_keep=1")
        shutil.rmtree(wheelhouse, ignore_errors=True)
        shutil.rmtree(mine, ignore_errors=True)
    assert back.returncode == 0, back.stdout[-4000:] + back.stderr[-2000:]
    assert current(sandbox_cluster) == before
    left = sandbox_cluster.exec("node2", "ls", "/opt/clustertrain/envs").stdout.split()
    assert left == [Path(before).parent.name], left
