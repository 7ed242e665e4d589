"""The node's side of a notebook: the port and token chosen on the node and written to the
job's directory only, and the arguments JupyterLab gets. JupyterLab itself is not
installed here: a stand-in package named jupyterlab (a test double, recording what it was
started with) takes its place; the real server runs in test_notebook_sandbox.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from orchestrator.node.notebook import jupyter_argv, look_interval

REPO = Path(__file__).resolve().parents[3]
STAND_IN = ("import json, os, sys\n"
            "open(os.environ['SAW'], 'w').write(json.dumps(sys.argv))\n")


def test_jupyterlab_listens_on_loopback_with_the_nodes_token_and_ends_when_idle() -> None:
    argv = jupyter_argv(41000, "t0k", "/home/bob", 0)
    assert {"--ip=127.0.0.1", "--port=41000", "--ServerApp.port_retries=0",
            "--IdentityProvider.token=t0k", "--ServerApp.root_dir=/home/bob",
            "--no-browser"} <= set(argv)
    assert not [a for a in argv if "timeout" in a]
    idle = jupyter_argv(41000, "t0k", "/home/bob", 600)
    assert {"--ServerApp.shutdown_no_activity_timeout=600",
            "--MappingKernelManager.cull_idle_timeout=600",
            "--MappingKernelManager.cull_interval=60",
            "--TerminalManager.cull_interval=60"} <= set(idle)


def test_a_short_idle_is_looked_for_often_enough_to_end_on_time() -> None:
    # JupyterLab's own look comes once a minute: --idle 10 would end 60-120 s late.
    assert [look_interval(s) for s in (10, 45, 600, 3600, 86400, 0.5)] == [1, 4, 60, 60, 60, 1]
    assert "--MappingKernelManager.cull_interval=1" in jupyter_argv(1, "t", "/h", 10)


def test_the_port_and_token_go_to_the_job_directory_only(tmp_path) -> None:
    (tmp_path / "stand-in" / "jupyterlab").mkdir(parents=True)
    (tmp_path / "stand-in" / "jupyterlab" / "__init__.py").write_text("")
    (tmp_path / "stand-in" / "jupyterlab" / "__main__.py").write_text(STAND_IN)
    home, run_id = tmp_path / "home", "20261127-170914-c2117f"
    job = home / ".clustertrain" / "jobs" / run_id
    job.mkdir(parents=True)
    saw = tmp_path / "argv.json"
    env = {**os.environ, "HOME": str(home), "CLUSTERTRAIN_RUN_ID": run_id, "SAW": str(saw),
           "PYTHONPATH": f"{tmp_path / 'stand-in'}:{REPO}"}
    proc = subprocess.run([sys.executable, "-m", "orchestrator.node.notebook", "--idle", "30"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    info = json.loads((job / "notebook.json").read_text())
    assert stat.S_IMODE((job / "notebook.json").stat().st_mode) == 0o600
    argv = json.loads(saw.read_text())
    assert f"--port={info['port']}" in argv and f"--IdentityProvider.token={info['token']}" \
        in argv and f"--ServerApp.root_dir={home}" in argv
    assert len(info["token"]) >= 32 and info["token"] not in proc.stdout + proc.stderr
    assert f"127.0.0.1:{info['port']}" in proc.stdout


def test_outside_a_run_it_says_what_it_is_for(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CLUSTERTRAIN_RUN_ID"}
    proc = subprocess.run([sys.executable, "-m", "orchestrator.node.notebook"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "starts as a run of `clustertrain notebook`" in proc.stderr


def test_an_environment_without_jupyterlab_is_named_with_the_fix(tmp_path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "CLUSTERTRAIN_RUN_ID": "20261127-170914-c2117f",
           "PYTHONPATH": str(REPO)}
    # -S: no site-packages, so no jupyterlab whatever this machine has installed.
    proc = subprocess.run([sys.executable, "-S", "-m", "orchestrator.node.notebook"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "has no jupyterlab: add jupyterlab to its environment file" in proc.stderr
    assert not home.exists()
