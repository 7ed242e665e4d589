"""What a new user meets first: bad input and misuse, refused with a message that names the
problem and the fix, the right exit code, and nothing started or left behind.

No sandbox: the inventory points at loopback, where nothing listens on the SSH port, so a
command that got as far as SSH would say "cannot reach"; none of these may get there.
The sandbox's share of the same classes is in test_first_use_sandbox.py.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.diagnosis.dumps import Diagnosis
from orchestrator.errors import LaunchError
from orchestrator.provision.wheelhouse import (
    WheelhouseError,
    WheelhouseRequest,
    load_environment,
    target_python,
)
from orchestrator.record.rundir import RunDir, new_run_id
from orchestrator.record.status import cut_short as summary_cut_short
from orchestrator.record.summary import RunStatus
from orchestrator.run.sync import code_digest, left_out
from orchestrator.workloads.doctor_run import DoctorRequest

from ...clirun import run_cli as run


def refused(setup, capsys, *argv: str) -> str:
    """ARGV is refused before any node: exit 1 or 2, no "cannot reach", no record."""
    base, runs = setup
    code, out = run([*base, "--nodes", "2", *argv], capsys)
    assert code in (1, 2), out
    assert "cannot reach" not in out and not runs.exists(), out
    return out


# -- names and options the tool sets itself ------------------------------------------------
@pytest.mark.parametrize("item, words", [
    ("CLUSTERTRAIN_RUN_ID=x", "CLUSTERTRAIN_RUN_ID is set by clustertrain for every run"),
    ("CLUSTERTRAIN_BACKEND=nccl", "CLUSTERTRAIN_BACKEND is set by clustertrain"),
    ("MASTER_ADDR=10.0.0.1", "MASTER_ADDR is set by clustertrain: node 0's cluster address"),
    ("RANK=3", "RANK is set by torchrun for each worker"),
    ("TORCHELASTIC_RUN_ID=x", "TORCHELASTIC_RUN_ID is set by torchrun"),
])
def test_a_name_the_tool_sets_is_refused_in_env(setup, capsys, item, words) -> None:
    out = refused(setup, capsys, "--env", item, "job.py")
    assert f"error: --env {item.split('=')[0]}: {words}" in out
    assert "a job cannot set it" in out


def test_the_users_env_never_hides_the_run_from_stop() -> None:
    """Even a record made without parse_env: the run's id on the node is the run's."""
    from orchestrator.run.command import NodeCommand
    cmd = NodeCommand(run_id="r1", node_rank=0, nnodes=1, nproc=1, master_addr="a",
                      master_port=1, torchrun="t", home="/h", script="s.py", node="n0",
                      nodes=("n0",), run_state="/s",
                      env={"CLUSTERTRAIN_RUN_ID": "x", "TORCH_FR_BUFFER_SIZE": "0"})
    env = cmd.environment()
    assert env["CLUSTERTRAIN_RUN_ID"] == "r1" and env["TORCH_FR_BUFFER_SIZE"] == "0"


@pytest.mark.parametrize("arg, owner", [
    ("--nnodes=3", "--nnodes is set by clustertrain from --nodes/--hosts"),
    ("--nnode=3", "--nnodes is set by clustertrain"),          # torchrun takes prefixes
    ("--node_rank=1", "--node-rank is set by clustertrain"),   # and '_' for '-'
    ("--master-addr=10.0.0.9", "--master-addr is set by clustertrain from node 0's"),
    ("--rdzv-endpoint=h:1", "--rdzv-endpoint is set by clustertrain"),
    ("--standalone", "--standalone is set by clustertrain"),
])
def test_a_torchrun_option_the_launch_sets_is_refused(setup, capsys, arg, owner) -> None:
    out = refused(setup, capsys, f"--torchrun-arg={arg}", "job.py")
    assert f"error: --torchrun-arg={arg}: torchrun's {owner}" in out


def test_other_torchrun_options_pass_through(setup, capsys) -> None:
    from orchestrator.run.command import check_torchrun_args
    check_torchrun_args(("--monitor-interval=1", "--rdzv-conf=timeout=900", "--role", "w"))


# -- how the command line is read ------------------------------------------------------------
def test_no_option_is_abbreviated(setup, capsys) -> None:
    out = refused(setup, capsys, "--keep", "3", "job.py")
    assert "error: unrecognized arguments: --keep" in out and "train" in out.splitlines()[-2]


def test_no_option_is_abbreviated_in_any_verb(capsys) -> None:
    code, out = run(["sandbox", "up", "--nod", "3"], capsys)
    assert code == 2 and "unrecognized arguments: --nod 3" in out


@pytest.mark.parametrize("option", ["--dry-run", "--detach", "--nodes=2", "--env=A=1"])
def test_a_tool_option_after_the_script_is_refused(setup, capsys, option) -> None:
    out = refused(setup, capsys, "job.py", option, "--epochs", "3")
    assert f"{option} comes after the script job.py" in out
    assert f"put it before the script (train {option} ... job.py)" in out
    assert f"after -- to pass it to the script (train ... job.py -- {option})" in out


@pytest.mark.parametrize("tail, script_args", [
    (["job.py", "--", "--dry-run"], ("--dry-run",)),
    (["job.py", "--epochs", "3", "--", "--dry-run"], ("--epochs", "3", "--dry-run")),
    (["--", "--dry-run", "--", "x"], ("--dry-run", "--", "x")),
])
def test_after_the_separator_it_is_the_scripts(setup, tail, script_args) -> None:
    from orchestrator.cli import cmd_train, parse
    base, _ = setup
    (Path(base[4]) / "train.py").write_text("print(1)\n")  # the default script
    args = parse([*base, "--nodes", "2", *tail])
    assert cmd_train.parse_request(args).script_args == script_args and not args.dry_run


def test_script_options_without_the_separator_get_the_hint(setup, capsys) -> None:
    out = refused(setup, capsys, "--epochs", "3")
    assert "python -m orchestrator train: error: unrecognized arguments: --epochs" in out
    assert "options for the script go after --" in out and "-- --epochs 3" in out
    assert "usage: python -m orchestrator train" in out  # the verb's usage, not the top's


def test_a_script_that_is_a_directory_is_named_as_such(setup, capsys) -> None:
    out = refused(setup, capsys, "pkg")
    assert "error: script 'pkg' is a directory in" in out
    assert "name the script in it (it holds train.py), or run a package with -m" in out


def test_a_runs_dir_that_cannot_be_written_is_refused_first(setup, capsys, tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    base, _ = setup
    where = tmp_path / "file" / "runs"
    code, out = run([*base, "--nodes", "2", "--runs-dir", str(where), "job.py"], capsys)
    assert code == 2 and f"error: --runs-dir {where}: {tmp_path / 'file'} is not a " \
        "directory; choose a directory you can write in" in out
    assert "cannot reach" not in out


def test_arguments_too_long_for_a_command_line_are_refused_first(setup, capsys) -> None:
    out = refused(setup, capsys, "job.py", "--", "--notes", "x" * 130_000)
    assert "the script's arguments and --env values come to 130" in out
    assert "Put them in a file in --workdir and pass its name" in out


# -- doctor ---------------------------------------------------------------------------------
def test_doctor_on_one_node_is_refused(setup, capsys) -> None:
    base, _ = setup
    code, out = run(["doctor", *base[1:3], "--nodes", "1"], capsys)
    assert code == 1 and "doctor compares the nodes with each other" in out
    assert "choose 2 nodes or more" in out and "cannot reach" not in out


def test_a_large_all_reduce_is_a_size_not_seconds() -> None:
    assert DoctorRequest(allreduce_mb=100).allreduce_mb == 100
    with pytest.raises(LaunchError, match=r"at most 8192 \(the all_reduce's size in MB"):
        DoctorRequest(allreduce_mb=10_000)
    with pytest.raises(LaunchError, match=r"at most 60 \(seconds to measure\)"):
        DoctorRequest(link_seconds=100)


# -- records ---------------------------------------------------------------------------------
def record(root: Path, summary: str | None, info: str | None = None) -> RunDir:
    run = RunDir(root, new_run_id())
    run.path.mkdir(parents=True)
    run.run_json.write_text(info if info is not None else json.dumps(
        {"run_id": run.run_id, "nodes": ["node0"], "script": "job.py", "script_args": []}))
    if summary is not None:
        run.summary_json.write_text(summary)
    return run


@pytest.mark.parametrize("broken", [
    '{"run_id": "x", "status": "failed", "start": "...", "error": "Ctrl-C"}',  # no duration
    '{"run_id": "x", "status": "succ',                                         # cut short
    "[1, 2]",                                                                  # not a record
])
def test_one_broken_record_does_not_break_runs(tmp_path: Path, capsys, broken) -> None:
    good = record(tmp_path, json.dumps({"status": "succeeded", "duration_s": 3.0}))
    bad = record(tmp_path, broken)
    code, out = run(["runs", "--runs-dir", str(tmp_path)], capsys)
    assert code == 0, out
    rows = {line.split()[0]: line for line in out.splitlines() if line[:1].isdigit()}
    assert "succeeded" in rows[good.run_id] and "unreadable" in rows[bad.run_id]
    assert f"note: run {bad.run_id}: {bad.summary_json}" in out
    code, out = run(["runs", "show", bad.run_id, "--runs-dir", str(tmp_path)], capsys)
    assert code == 2 and f"error: run {bad.run_id}: {bad.summary_json}" in out
    assert "Traceback" not in out


def test_a_record_whose_run_json_is_cut_short_is_listed_as_unreadable(tmp_path, capsys) -> None:
    bad = record(tmp_path, None, info='{"run_id": "x", "no')
    code, out = run(["runs", "--runs-dir", str(tmp_path)], capsys)
    assert code == 0 and "unreadable" in out and f"{bad.run_json} cannot be read" in out


@pytest.mark.parametrize("status, launched, end", [
    (RunStatus.INTERRUPTED, (), "not-started"),
    (RunStatus.FAILED, (), "not-started"),
    (RunStatus.INTERRUPTED, ("node0",), "controller-lost"),
    (RunStatus.FAILED, ("node0",), "stopped"),
])
def test_a_run_cut_short_has_a_whole_summary(tmp_path, capsys, status, launched, end) -> None:
    run_ = record(tmp_path, None)
    summary = summary_cut_short(run_.info(), status, 0.0, "why", launched)
    run_.write_summary(summary)
    assert run_.summary() == summary and summary.nodes[0].end_reason == end
    code, out = run(["runs", "--runs-dir", str(tmp_path)], capsys)
    assert code == 0 and f"{run_.run_id}   {status}" in out


# -- hangs that name nobody -------------------------------------------------------------------
def test_a_hang_with_no_worker_to_dump_says_why_nobody_is_named(tmp_path) -> None:
    verdict = Diagnosis(None, None, tmp_path, []).to_json()["verdict"]
    assert verdict and "None" not in verdict
    assert "no worker process was found on any node" in verdict
    assert "still in its rendezvous" in verdict


# -- the code sync ---------------------------------------------------------------------------
def test_a_runs_directory_inside_the_work_directory_is_not_synced(tmp_path) -> None:
    work = tmp_path / "work"
    (work / "runs" / "r1").mkdir(parents=True)
    (work / "job.py").write_text("print(1)\n")
    exclude = left_out(work, work / "runs", tmp_path / "elsewhere")
    assert exclude == ("runs",)
    before = code_digest(work, exclude)
    (work / "runs" / "r2.log").write_text("a new run's log\n")
    assert code_digest(work, exclude) == before
    assert code_digest(work) != before  # without it, every run would change it


# -- wheelhouse --------------------------------------------------------------------------------
def environment(tmp_path: Path, *conda: str) -> Path:
    path = tmp_path / "env.yml"
    path.write_text("name: t\ndependencies:\n" + "".join(f"  - {c}\n" for c in conda)
                    + "  - pip:\n      - six\n")
    return path


def test_the_wheelhouse_is_for_the_python_the_file_asks_for(tmp_path) -> None:
    env = environment(tmp_path, "python=3.9", "pip")
    request = target_python(WheelhouseRequest(env, tmp_path / "wh"), load_environment(env))
    assert request.python_version == "3.9"
    with pytest.raises(WheelhouseError, match="--python-version 3.11 contradicts .* asks for "
                       "python 3.9; give --python-version 3.9"):
        target_python(WheelhouseRequest(env, tmp_path / "wh", python_version="3.11"),
                      load_environment(env))
    # This machine's X.Y too: pip then resolves for X.Y.0, not for this machine's patch
    # release (soupsieve 4.1.3 needs >=3.11.5: chosen with 3.11.7 here, it would not install
    # on a node's Debian 3.11.2).
    here = "%d.%d" % sys.version_info[:2]
    ours = environment(tmp_path, f"python={here}", "pip")
    request = target_python(WheelhouseRequest(ours, tmp_path / "wh"), load_environment(ours))
    assert request.python_version == here


def test_a_wheelhouse_dest_that_cannot_be_written_is_refused(tmp_path, capsys) -> None:
    env = environment(tmp_path, "python=3.11", "pip")
    (tmp_path / "f").write_text("a file, not a directory")
    code, out = run(["wheelhouse", "--env", str(env), "--dest", str(tmp_path / "f" / "wh")],
                    capsys)
    assert code == 2 and f"error: --dest {tmp_path / 'f' / 'wh'}: {tmp_path / 'f'} is not a " \
        "directory" in out and "Traceback" not in out


@pytest.mark.slow  # pip download, for real
def test_the_wheelhouse_names_what_it_leaves_to_conda(tmp_path, capsys) -> None:
    env = environment(tmp_path, "python=3.11", "pip", "numpy", "cudatoolkit=11.8")
    code, out = run(["wheelhouse", "--env", str(env), "--dest", str(tmp_path / "wh")], capsys)
    assert code == 0, out
    assert f"note: {env} also asks conda for numpy, cudatoolkit=11.8: not in the wheelhouse" \
        in out
    assert (tmp_path / "wh").is_dir()


# -- data ------------------------------------------------------------------------------------
def test_a_url_without_a_scheme_is_refused(tmp_path, capsys) -> None:
    code, out = run(["data", "cifar10", "--url", "example.com/c.tgz", "--dest",
                     str(tmp_path / "d")], capsys)
    assert code == 2 and "--url 'example.com/c.tgz' is not a download address" in out
    assert "e.g. https://example.com/c.tgz" in out and not (tmp_path / "d").exists()


def test_a_url_at_a_port_that_is_not_http_is_refused(tmp_path, capsys) -> None:
    """A real server that speaks another protocol (an SSH greeting) on loopback."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def greet() -> None:
        conn, _ = server.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
        conn.recv(100)
        conn.close()

    threading.Thread(target=greet, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/c.tgz"
    code, out = run(["data", "cifar10", "--url", url, "--dest", str(tmp_path / "d")], capsys)
    server.close()
    assert code == 2 and "what answers there is not an HTTP server" in out
    assert "SSH-2.0" in out and "Traceback" not in out and not (tmp_path / "d").exists()


# -- provision ---------------------------------------------------------------------------------
@pytest.mark.parametrize("item, words", [
    ("FOO", "-e 'FOO' is not KEY=VALUE: FOO sets no variable"),
    ("a=1 FOO", "-e 'a=1 FOO' is not KEY=VALUE: FOO sets no variable"),
    ("{a", "-e '{a' is not valid YAML/JSON"),
    ("[1, 2]", "-e '[1, 2]' is not a mapping of variables"),
    ("@/nonexistent.yml", "-e @/nonexistent.yml: /nonexistent.yml does not exist"),
])
def test_provision_refuses_extra_vars_it_cannot_pass_on(setup, capsys, item, words) -> None:
    base, _ = setup
    code, out = run(["provision", base[1], base[2], "-e", item], capsys)
    assert code == 2 and words in out and "RECAP" not in out, out


def test_provision_takes_what_ansible_takes() -> None:
    from orchestrator.provision.site import check_extra_vars
    for item in ("a=1", "a=1 b='two words'", '{"a": 1}', "{a: 1}"):
        check_extra_vars(item)
