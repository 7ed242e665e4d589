"""What a new user meets first, on the real-site sandbox (3 nodes behind a bastion, as
alice; bob has no sudo): one machine under two inventory names, Ctrl-C during the code
sync, provisioning without root, a healthy run's output, the packages every script expects.
The classes that need no node are in test_first_use.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ...cluster import ENV as PODMAN_ENV, REPO, ProvisionedCluster as Sandbox, orchestrator
from ..run.test_supervision_sandbox import cli
from ..run.test_train_sandbox import Train, assert_no_job_processes

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1500)]


def test_two_inventory_names_for_one_machine_are_refused(sandbox_cluster: Sandbox,
                                                         tmp_path: Path) -> None:
    """The issue's case: a host whose ansible_host reaches node0 (here through an alias of
    the user's SSH config, which no check of the inventory can see through) and whose
    cluster_address is node1's address. Before, both supervisors shared node0's job directory and
    the '2-node' run succeeded on one machine."""
    inventory = yaml.safe_load(sandbox_cluster.inventory.read_text())
    ssh_args = inventory["all"]["vars"]["ansible_ssh_common_args"]
    config = Path(ssh_args.split("-F", 1)[1].strip())
    alias = config.read_text().split("Host node0\n", 1)[1].split("\n\n")[0]
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(config.read_text() + "\nHost lab-a\n" + alias + "\n")
    inventory["all"]["vars"]["ansible_ssh_common_args"] = f"-F {ssh_config}"
    nodes = inventory["all"]["children"]["cluster"]["children"]["train_nodes"]["hosts"]
    nodes["nodeA"] = {"ansible_host": "lab-a",
                      "cluster_address": sandbox_cluster.nodes["node1"]}  # node1's address
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory))
    p = cli(sandbox_cluster, tmp_path / "runs", "train", "-i", str(path), "--hosts",
            "node0,nodeA", "--", "--epochs", "1")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "node0 and nodeA are the same machine (host name node0" in p.stdout
    assert "the inventory reaches it as node0 (alice@node0) and as nodeA (alice@lab-a)" \
        in p.stdout
    assert "nothing was started" in p.stderr and not (tmp_path / "runs").exists()


def test_ctrl_c_during_the_code_sync_is_an_interrupt_with_a_whole_record(
        sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) while the code syncs: the playbook
    is stopped, train says interrupted and exits 130, the record is whole and `runs`
    reads it, and nothing runs on any node."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text("print('never')\n")
    (work / "blob.bin").write_bytes(os.urandom(400 * 2**20))  # the sync takes seconds
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "train", "-i", str(sandbox_cluster.inventory),
         "--nodes", "3", "--workdir", str(work), "--runs-dir", str(runs), "job.py"],
        cwd=REPO, env=PODMAN_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if ": syncing " in line:
            break
    time.sleep(1.5)  # the playbook is copying
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "interrupted" in err and "code sync failed" not in out + err
    (run,) = list(runs.iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["duration_s"] > 0, summary
    assert {n["end_reason"] for n in summary["nodes"]} == {"not-started"}
    listed = cli(sandbox_cluster, runs, "runs")
    assert listed.returncode == 0 and f"{run.name}   interrupted" in listed.stdout, listed
    assert_no_job_processes(sandbox_cluster, ("node0", "node1", "node2"), within=15)


def test_provisioning_without_root_says_so_at_once(sandbox_cluster: Sandbox,
                                                   tmp_path: Path) -> None:
    """bob has no sudo. Before, site.yml ran 48 tasks and failed with 'One or more items
    failed'; now the first task says that provisioning needs root, without colour codes."""
    started = time.monotonic()
    p = orchestrator("provision", "-i", str(sandbox_cluster.inventories["bob"]))
    took = time.monotonic() - started
    assert p.returncode == 1, p.stdout + p.stderr
    assert "provisioning configures the system and acts as root, but this play runs as " \
        "uid 1002" in p.stdout
    assert "ok=2 changed=0 failed=1" in p.stdout and took < 60
    p = orchestrator("provision", "-i", str(sandbox_cluster.inventories["bob"]), "-e",
                     "ansible_become=true")
    assert p.returncode == 1 and "becoming root failed on node0, node1, node2" in p.stderr
    assert "\x1b[" not in p.stdout + p.stderr


def test_a_healthy_run_prints_no_warning_and_finds_the_usual_packages(
        sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    """The project's environment carries numpy, pandas, tqdm and yaml: every rank imports
    them, and torch prints no 'Failed to initialize NumPy' on any rank."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(
        "import numpy, pandas, tqdm, yaml, torch\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "x = torch.from_numpy(numpy.ones(4, dtype='float32'))\n"
        "dist.all_reduce(x)\n"
        "print('sum', int(x.sum()), 'numpy', numpy.__version__, 'pandas', pandas.__version__)\n"
        "dist.destroy_process_group()\n")
    t = Train(sandbox_cluster, tmp_path / "runs", "--nodes", "3", "--workdir", str(work),
              "job.py")
    code = t.finish(timeout=300)
    assert code == 0, t.text[-3000:] + t.stderr
    assert t.text.count("sum 12 numpy 2.") == 3, t.text
    assert "Warning" not in t.text and "warning" not in t.text.lower(), t.text
    assert "straggler" not in t.text and "slower than the median" not in t.text
