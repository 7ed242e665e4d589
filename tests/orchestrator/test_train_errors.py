"""Item 8: bad input is refused with one clear message, before any node is touched.

No sandbox: the inventory points at loopback, where nothing listens on the SSH port."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from orchestrator.cli import main


@pytest.fixture
def setup(tmp_path: Path):
    # A loopback port with nothing listening: "unreachable" without any other host.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        "[train_nodes]\n"
        f"node0 ansible_host=127.0.0.1 ansible_port={port}\n"
        f"node1 ansible_host=127.0.0.1 ansible_port={port}\n"
        "[all:vars]\nansible_user=root\n"
        f"ansible_ssh_common_args='-o UserKnownHostsFile={tmp_path}/known_hosts'\n")
    work = tmp_path / "code"
    work.mkdir()
    (work / "job.py").write_text("print('hi')\n")
    runs = tmp_path / "runs"
    return ["train", "-i", str(inventory), "--workdir", str(work), "--runs-dir", str(runs)], runs


def run(argv, capsys) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_nodes_larger_than_inventory(setup, capsys) -> None:
    base, runs = setup
    code, out = run([*base, "--nodes", "3", "job.py"], capsys)
    assert code != 0
    assert "error: --nodes 3: the inventory" in out and "has only 2 node(s)" in out
    assert not runs.exists()


def test_unknown_host(setup, capsys) -> None:
    base, runs = setup
    code, out = run([*base, "--hosts", "node0,gpu7", "job.py"], capsys)
    assert code != 0 and "unknown host(s) gpu7" in out and "node0, node1" in out


def test_script_missing(setup, capsys) -> None:
    base, runs = setup
    code, out = run([*base, "--nodes", "2", "tarin.py"], capsys)
    assert code != 0 and "script 'tarin.py' not found in" in out
    assert not runs.exists()


def test_malformed_env(setup, capsys) -> None:
    base, runs = setup
    code, out = run([*base, "--nodes", "2", "--env", "LR0.1", "job.py"], capsys)
    assert code != 0 and "--env 'LR0.1' is not KEY=VALUE" in out


def test_unreachable_node(setup, capsys) -> None:
    base, runs = setup
    code, out = run([*base, "--nodes", "2", "job.py"], capsys)
    assert code != 0
    assert "node0: cannot reach root@127.0.0.1" in out and "node1: cannot reach" in out
    assert "nothing was started" in out
    assert not runs.exists()


def test_dry_run_needs_reachable_nodes_too(setup, capsys) -> None:
    base, runs = setup
    code, out = run([*base, "--nodes", "1", "--dry-run", "job.py"], capsys)
    assert code != 0 and "cannot reach" in out and not runs.exists()


@pytest.mark.parametrize("argv,script,script_args", [
    (["--nodes", "2"], "train.py", ()),
    (["--nodes", "2", "--", "--epochs", "3"], "train.py", ("--epochs", "3")),
    (["--nodes", "2", "train.py", "--", "--epochs", "3"], "train.py", ("--epochs", "3")),
])
def test_script_defaults_to_the_training_job(argv, script, script_args):
    import argparse as _argparse

    from orchestrator import train as train_cmd

    parser = _argparse.ArgumentParser()
    train_cmd.register(parser.add_subparsers())
    request = train_cmd.parse_request(parser.parse_args(["train", *argv]))
    assert (request.script, request.script_args) == (script, script_args)
