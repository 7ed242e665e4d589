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
import threading
import time
from pathlib import Path

from orchestrator.node.notebook import (
    STALE_AFTER,
    Access,
    TokenKeeper,
    jupyter_argv,
    keep_token,
    look_interval,
    read_access,
    wanted_token,
)

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
    # The token it starts with is the access file's first: it expires as a connect's does.
    access = job / "notebook-access.json"
    assert stat.S_IMODE(access.stat().st_mode) == 0o600
    assert json.loads(access.read_text()) == {"token": info["token"]}


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


T1, T2 = "a" * 43, "b" * 43


def test_the_access_files_token_opens_the_server_only_while_it_is_fresh() -> None:
    assert wanted_token(Access(T1, at=1000.0), now=1000.0 + STALE_AFTER - 1) == T1
    assert wanted_token(Access(T1, at=1000.0), now=1000.0 + STALE_AFTER + 1) is None
    assert wanted_token(None, now=1000.0) is None


def test_a_missing_unreadable_or_too_short_token_is_no_access(tmp_path) -> None:
    path = tmp_path / "notebook-access.json"
    assert read_access(str(path)) is None
    for text in ("", "{", '{"token": ""}', '{"token": "short"}', '{"token": 7}', "[]"):
        path.write_text(text)
        assert read_access(str(path)) is None, text
    path.write_text(json.dumps({"token": T1, "mark": "m"}))
    os.utime(path, (1234.0, 1234.0))
    assert read_access(str(path)) == Access(T1, 1234.0)


def test_the_token_follows_each_connect_and_is_voided_when_it_ends_or_goes_stale() -> None:
    keeper = TokenKeeper(T1)          # the token JupyterLab started with, fresh
    assert keeper.step(Access(T1, 100.0), 101.0) is None
    assert keeper.step(Access(T2, 110.0), 111.0) == T2   # a connect's own token
    assert keeper.step(Access(T2, 140.0), 141.0) is None  # touched: nothing changes
    voided = keeper.step(None, 150.0)                     # the connect ended (file removed)
    assert voided and voided not in (T1, T2) and len(voided) >= 32
    assert keeper.step(None, 151.0) is None               # voided once, not at each look
    assert keeper.step(Access(T1, 160.0), 161.0) == T1    # the next connect
    stale = keeper.step(Access(T1, 160.0), 160.0 + STALE_AFTER + 1)   # controller killed
    assert stale and stale not in (T1, T2, voided)


def test_the_thread_gives_each_change_to_the_server_once_it_runs(tmp_path) -> None:
    path = tmp_path / "notebook-access.json"
    path.write_text(json.dumps({"token": T2}))
    given: list[str] = []
    up = threading.Event()             # the server's state: not running at first

    def server(token: str) -> bool:
        """The server's side of a change: taken once the server is up."""
        if up.is_set():
            given.append(token)
        return up.is_set()

    stop = threading.Event()
    thread = threading.Thread(target=keep_token, args=(str(path), TokenKeeper(T1), server),
                              kwargs={"every": 0.05, "stop": stop}, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        assert given == []             # asked again until the server takes it
        up.set()
        wait(lambda: given == [T2])
        path.unlink()                  # the connect ended
        wait(lambda: len(given) == 2)
        assert given[1] not in (T1, T2)
        path.write_text(json.dumps({"token": T1}))
        os.utime(path, (time.time() - STALE_AFTER - 5,) * 2)   # its controller was killed
        time.sleep(0.3)
        assert len(given) == 2         # stale: stays void, and is not voided again
    finally:
        stop.set()
        thread.join(timeout=5)


def wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)
