"""`notebook`'s own parts, without a cluster: its run's spec, what it refuses before any
node is touched, where it starts, the tunnel's end here, and `connect` of a run that is no
notebook or has ended. The sandbox test (test_notebook_sandbox.py) runs it for real."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from orchestrator.cluster.inventory import load_cluster
from orchestrator.errors import ClusterError, LaunchError
from orchestrator.node.protocol import NOTEBOOK_MODULE
from orchestrator.record.rundir import RunDir
from orchestrator.record.status import RunStatus, cut_short
from orchestrator.run.spec import Given
from orchestrator.workloads.notebook import (
    DEFAULT_IDLE,
    Served,
    free_local_port,
    least_busy,
    notebook_spec,
    uncordoned,
)

from ...clirun import run_cli as run


def given(**values) -> dict[str, Given]:
    return {k: Given(v, "--" + k.replace("_", "-")) for k, v in values.items()}




def test_a_notebook_is_one_process_on_one_node_running_jupyterlab_and_no_code(tmp_path) -> None:
    spec = notebook_spec(given(runs_dir=str(tmp_path / "runs"), host="node1"))
    assert (spec.hosts, spec.nodes, spec.script, spec.module) == (("node1",), None,
                                                                   NOTEBOOK_MODULE, True)
    assert (spec.nproc_per_node, spec.hang_timeout, spec.workdir) == (1, 0.0, None)
    assert spec.script_args == () and not spec.detach and spec.run_id
    anywhere = notebook_spec(given(runs_dir=str(tmp_path / "runs")))
    assert (anywhere.hosts, anywhere.nodes) == (None, 1)   # the least busy, or Slurm's
    detached = notebook_spec(given(runs_dir=str(tmp_path / "runs"), detach=True))
    assert detached.script_args == ("--idle", f"{DEFAULT_IDLE:g}")
    queued = notebook_spec(given(runs_dir=str(tmp_path / "runs"), queue=True, gpus_per_node=1,
                                 python_env="mine"))
    assert (queued.queue, queued.gpus_per_node, queued.python_env) == (True, 1, "mine")


@pytest.mark.parametrize("values, words", [
    ({"idle": 60.0}, "--idle goes with --detach"),
    ({"idle": -1.0, "detach": True}, "--idle -1.0: give the seconds without a request"),
    ({"idle": float("nan"), "detach": True}, "--idle nan"),
    ({"gpus_per_node": 1}, "--gpus-per-node goes with --queue"),
    ({"python_env": "../x"}, "--python-env"),
])
def test_what_a_notebook_cannot_be_given_is_refused(tmp_path, values, words) -> None:
    with pytest.raises(ClusterError, match=words.replace("(", r"\(")):
        notebook_spec(given(runs_dir=str(tmp_path / "runs"), **values))


def test_the_command_refuses_a_run_id_where_it_does_not_belong_before_any_node(
        tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    code, out = run(["notebook", "connect", "--runs-dir", str(runs)], capsys)
    assert code == 1 and "notebook connect needs the notebook's run id" in out
    code, out = run(["notebook", "start", "20261127-170914-c2117f", "--runs-dir", str(runs)],
                    capsys)
    assert code == 1 and "a run id goes with connect or stop" in out
    code, out = run(["notebook", "open"], capsys)
    assert code == 2 and "invalid choice: 'open'" in out
    code, out = run(["notebook", "--port", "70000", "--runs-dir", str(runs)], capsys)
    assert code == 2 and "argument --port: 70000: choose a port in 1-65535" in out
    assert not runs.exists()


def recorded(runs: Path, run_id: str, script: str, ended: bool) -> None:
    run = RunDir(runs, run_id)
    info = {"run_id": run_id, "nodes": ["node1"], "script": script, "script_args": [],
            "inventory": "/nowhere.ini", "users": {"node1": "bob"}}
    run.create(info)
    if ended:
        run.write_summary(cut_short(info, RunStatus.INTERRUPTED, time.time(), "Ctrl-C", ()))


def test_connect_names_a_run_that_is_no_notebook_or_has_ended(tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    recorded(runs, "20261127-100000-aaaaaa", "train.py", ended=False)
    recorded(runs, "20261127-100001-bbbbbb", NOTEBOOK_MODULE, ended=True)
    code, out = run(["notebook", "connect", "20261127-100000-aaaaaa", "--runs-dir",
                     str(runs)], capsys)
    assert code == 2 and "is not a notebook (it ran train.py)" in out
    code, out = run(["notebook", "connect", "20261127-100001-bbbbbb", "--runs-dir",
                     str(runs)], capsys)
    assert code == 2 and "has ended (interrupted); start another with `notebook`" in out
    code, out = run(["notebook", "connect", "20261127-100002-cccccc", "--runs-dir",
                     str(runs)], capsys)
    assert code == 2 and "20261127-100002-cccccc" in out


@pytest.fixture
def three(tmp_path):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[train_nodes]\n" + "".join(
        f"node{i} ansible_host=127.0.0.{i + 1}\n" for i in range(3)))
    return load_cluster(inventory)


def test_the_least_busy_node_is_chosen_the_first_among_equals(three) -> None:
    counts = {"node0": 2, "node1": 0, "node2": 0}
    assert least_busy(three, lambda node: counts[node.name]) == "node1"
    assert least_busy(three, lambda node: 0) == "node0"


def test_a_node_that_cannot_be_asked_is_passed_over_and_none_is_an_error(three) -> None:
    def count(node):
        if node.name != "node2":
            raise OSError(f"{node.name}: cannot reach")
        return 3
    assert least_busy(three, count) == "node2"
    with pytest.raises(LaunchError, match="no training node could be asked.*node0: cannot "
                       "reach.*Choose a node with --host"):
        least_busy(three, lambda node: (_ for _ in ()).throw(OSError(f"{node.name}: cannot "
                                                                       "reach")))


def test_the_tunnels_end_here_is_the_first_free_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        first = taken.getsockname()[1]
        port = free_local_port(first)
        assert port != first and port > 0


def test_the_servers_port_and_token_are_read_from_what_the_node_wrote() -> None:
    served = Served.parse("node1", json.dumps({"port": 40001, "token": "t0k", "pid": 7}))
    assert served == Served("node1", 40001, "t0k")


def test_a_cordoned_node_is_not_chosen_and_all_cordoned_is_named(three) -> None:
    assert uncordoned(three, lambda c: {"node0": {"why": "lost"}}).names == ["node1", "node2"]
    def unreadable(cluster):
        raise ClusterError("node0: cannot read the cordon record")
    assert uncordoned(three, unreadable).names == ["node0", "node1", "node2"]
    with pytest.raises(LaunchError, match="every training node is cordoned \\(node0: lost; "
                       "node1: disk; node2: gpu\\); uncordon one"):
        uncordoned(three, lambda c: {"node0": {"why": "lost"}, "node1": {"why": "disk"},
                                     "node2": {"why": "gpu"}})
