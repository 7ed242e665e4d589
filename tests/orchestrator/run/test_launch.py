"""The launch's two phases, run for real on this machine: each node's launch line under
bash (what its SSH session runs; the sandbox tests launch over SSH), the real supervisor
from the node package installed in each node's home, and a stand-in for torchrun that
records where and when it ran."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import cast

from orchestrator.cluster.inventory import NodeSpec
from orchestrator.cluster.ssh import Connection, SshTarget
from orchestrator.run.command import NodeCommand
from orchestrator.run.launch import Launch

from ..local_node import LocalNode, installed

# torchrun's stand-in: records its working directory, then lives SECONDS.
TORCHRUN = ("#!{python}\n"
            "import os, sys, time\n"
            "open(os.path.join(os.getcwd(), 'ran-' + os.environ['CLUSTERTRAIN_NODE_RANK']),"
            " 'w').write(str(time.time()))\n"
            "time.sleep({seconds})\n")


def nodes(tmp: Path, seconds: float = 1.0, count: int = 2, run_id: str = "r1",
          ) -> tuple[list[tuple[NodeSpec, NodeCommand]], dict[str, Connection]]:
    torchrun = tmp / "torchrun"
    torchrun.write_text(TORCHRUN.format(python=sys.executable, seconds=seconds))
    torchrun.chmod(0o755)
    names = tuple(f"n{i}" for i in range(count))
    pairs = []
    for i, name in enumerate(names):
        home = tmp / name
        (home / ".clustertrain" / "code" / run_id).mkdir(parents=True)
        installed(home)
        cmd = NodeCommand(run_id=run_id, node_rank=i, nnodes=count, nproc=1,
                          master_addr="127.0.0.1", master_port=29500, torchrun=str(torchrun),
                          home=str(home), script="train.py", node=name, nodes=names,
                          python=sys.executable, run_state=str(tmp / "shared" / run_id),
                          attached=False, cluster_env=str(tmp / "no-cluster.env"))
        pairs.append((NodeSpec(name, SshTarget("127.0.0.1"), "127.0.0.1"), cmd))
    return pairs, {name: cast(Connection, LocalNode(tmp / name)) for name in names}


def wait_for(path: Path, timeout: float = 30) -> Path:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path


def supervisors_left(tmp: Path) -> list[int]:
    """PIDs of processes whose command line names a job under TMP."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(tmp).encode() in cmdline and b"supervise" in cmdline:
            found.append(int(pid))
    return found


def test_every_node_starts_on_go_and_not_before(tmp_path: Path) -> None:
    pairs, clients = nodes(tmp_path)
    launch = Launch.start(pairs, clients)
    try:
        assert launch.ready() == {}
        time.sleep(0.5)
        # Loaded and waiting: nothing runs yet on any node.
        for _, cmd in pairs:
            assert not Path(cmd.job_dir, "pgid").exists()
            assert not list(Path(cmd.code_dir).glob("ran-*"))
        assert launch.go(b'k' * 32, {}) == {}
    finally:
        launch.cancel()
    for _, cmd in pairs:
        job = Path(cmd.job_dir)
        # torchrun ran in the run's code snapshot, under the supervisor whose PID the
        # launch reported and kept, which ended the run as exited.
        wait_for(Path(cmd.code_dir) / f"ran-{cmd.node_rank}")
        assert int((job / "supervisor.pid").read_text()) == launch.started[cmd.node]
        assert json.loads(wait_for(job / "exit").read_text())["reason"] == "exited"


def test_a_launch_called_off_before_go_starts_nothing(tmp_path: Path) -> None:
    pairs, clients = nodes(tmp_path)
    launch = Launch.start(pairs, clients)
    assert launch.ready() == {}
    launch.cancel()
    time.sleep(0.5)
    assert not supervisors_left(tmp_path)
    for _, cmd in pairs:
        assert not Path(cmd.job_dir, "pgid").exists()
        assert not Path(cmd.job_dir, "exit").exists()
        assert not list(Path(cmd.code_dir).glob("ran-*"))


def test_a_node_that_cannot_load_starts_no_node(tmp_path: Path) -> None:
    """n1's job directory cannot be made: the launch names n1 with mkdir's words, and n0,
    loaded and waiting, is called off without starting."""
    pairs, clients = nodes(tmp_path)
    (tmp_path / "n1" / ".clustertrain" / "jobs").write_text("not a directory")
    launch = Launch.start(pairs, clients)
    failed = launch.go(b'k' * 32, {})
    assert list(failed) == ["n1"]
    assert "mkdir" in failed["n1"] and "Not a directory" in failed["n1"], failed
    assert launch.started == {}
    time.sleep(0.5)
    assert not supervisors_left(tmp_path)
    assert not list((tmp_path / "n0" / ".clustertrain" / "code" / "r1").glob("ran-*"))


def test_a_node_whose_snapshot_is_missing_at_go_fails_with_its_path(tmp_path: Path) -> None:
    """GO comes after the code sync; a snapshot that is not there fails that node's start
    with the path (train then stops the nodes that started)."""
    pairs, clients = nodes(tmp_path, seconds=0.2)
    code = Path(pairs[1][1].code_dir)
    code.rmdir()
    launch = Launch.start(pairs, clients)
    failed = launch.go(b'k' * 32, {})
    assert list(failed) == ["n1"] and str(code) in failed["n1"], failed
    assert list(launch.started) == ["n0"]
    wait_for(Path(pairs[0][1].job_dir) / "exit")
