"""Item 8: bad input is refused with one clear message, before any node is touched.

No sandbox: the inventory points at loopback, where nothing listens on the SSH port."""

from __future__ import annotations

from pathlib import Path

import pytest

from ...clirun import run_cli as run


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
    assert code == 2 and "--env 'LR0.1' is not KEY=VALUE" in out


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


@pytest.mark.parametrize("extra, message", [
    (["--hosts", ""], "error: --hosts '' names no node; give inventory names separated by "
                      "commas, e.g. --hosts node0,node1"),
    (["--hosts", ","], "error: --hosts ',' names no node"),
    (["--nodes", "2", "--max-restarts", "-1"],
     "error: --max-restarts -1: give 0 (fail on the first worker failure) or a positive "
     "number of restarts"),
    (["--nodes", "2", "--grace", "-5"],
     "error: --grace -5.0: give the seconds between SIGTERM and SIGKILL as a number of 0 or "
     "more"),
    (["--nodes", "2", "--grace", "nan"], "error: --grace nan: give the seconds"),
    (["--nodes", "2", "--grace", "inf"], "error: --grace inf: give the seconds"),
    (["--nodes", "2", "-m", "pkg/train.py"],
     "error: -m 'pkg/train.py' is not a module name (dotted Python identifiers, e.g. -m "
     "mypkg.train)"),
])
def test_bad_input_is_refused_before_any_node(setup, capsys, extra, message) -> None:
    base, runs = setup
    code, out = run([*base, *extra, "job.py"], capsys)
    assert code != 0 and message in out
    # Refused before preflight: no connection was even tried, nothing was recorded.
    assert "cannot reach" not in out and not runs.exists()


def test_inventory_with_one_address_twice(tmp_path: Path, capsys) -> None:
    inventory = tmp_path / "dup.ini"
    inventory.write_text("[train_nodes]\nnode0 ansible_host=127.0.0.1\n"
                         "node1 ansible_host=127.0.0.1\n")
    code, out = run(["train", "-i", str(inventory), "--nodes", "2"], capsys)
    assert code != 0
    assert ("error: node0 and node1 in " in out and "have the same cluster_address "
            "(127.0.0.1); each training node must be a different machine" in out)
    assert "cannot reach" not in out


def test_unparseable_inventory(tmp_path: Path, capsys) -> None:
    inventory = tmp_path / "broken.yml"
    inventory.write_text("all:\n  children:\n    train_nodes: {hosts: [node0\n")
    code, out = run(["preflight", "-i", str(inventory)], capsys)
    assert code != 0
    assert f"error: Ansible cannot parse the inventory {inventory}" in out
    assert "Failed to parse" in out and "has no hosts" not in out


@pytest.mark.parametrize("argv,script,script_args", [
    (["--nodes", "2"], "train.py", ()),
    (["--nodes", "2", "--", "--epochs", "3"], "train.py", ("--epochs", "3")),
    (["--nodes", "2", "train.py", "--", "--epochs", "3"], "train.py", ("--epochs", "3")),
])
def test_script_defaults_to_the_training_job(argv, script, script_args):
    import argparse as _argparse

    from orchestrator.cli import cmd_train as train_cmd

    parser = _argparse.ArgumentParser()
    train_cmd.register(parser.add_subparsers())
    request = train_cmd.parse_request(parser.parse_args(["train", *argv]))
    assert (request.script, request.script_args) == (script, script_args)


@pytest.mark.parametrize("argv,script,script_args,module,clean_exit", [
    (["--nodes", "2", "-m", "pkg.train"], "pkg.train", (), True, True),
    (["--nodes", "2", "-m", "pkg.train", "--", "--epochs", "3"], "pkg.train",
     ("--epochs", "3"), True, True),
    (["--nodes", "2", "--module", "pkg.train", "--", "x.py"], "pkg.train", ("x.py",), True,
     True),
    (["--nodes", "2", "--no-clean-exit", "train.py", "--", "--epochs", "3"], "train.py",
     ("--epochs", "3"), False, False),
])
def test_a_module_and_no_clean_exit(argv, script, script_args, module, clean_exit):
    import argparse as _argparse

    from orchestrator.cli import cmd_train as train_cmd

    parser = _argparse.ArgumentParser()
    train_cmd.register(parser.add_subparsers())
    request = train_cmd.parse_request(parser.parse_args(["train", *argv]))
    assert (request.script, request.script_args, request.module, request.clean_exit) == (
        script, script_args, module, clean_exit)


@pytest.mark.parametrize("args, words", [
    (["--ignore-suspects"], "error: --ignore-suspects goes with --doctor"),
    (["--doctor", "--link-seconds", "0"], "error: --link-seconds 0: give a number above 0"),
    (["--doctor", "--allreduce-mb", "inf"], "error: --allreduce-mb inf: give a number"),
])
def test_bad_doctor_options_are_refused_before_any_node(setup, capsys, args, words) -> None:
    base, runs = setup
    code, out = run([*base, *args, "job.py"], capsys)
    assert code != 0 and words in out, out
    assert not runs.exists()
