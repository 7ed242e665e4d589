"""The per-node torchrun command line and --env parsing."""

from __future__ import annotations

import shlex

import pytest

from orchestrator.command import NodeCommand, TorchrunOptions, parse_env
from orchestrator.errors import LaunchError


def cmd(**kw) -> NodeCommand:
    base = dict(run_id="20260101-000000-abcdef", node_rank=1, nnodes=2, nproc=4,
                master_addr="10.0.0.1", master_port=29501,
                torchrun="/opt/clustertrain/venv/bin/torchrun", home="/home/alice",
                script="train.py",
                script_args=("--lr", "0.1"), env={"FOO": "a b"})
    base.update(kw)
    return NodeCommand(**base)


def test_torchrun_argv_static() -> None:
    argv = cmd().torchrun_argv()
    assert argv[:5] == ["/opt/clustertrain/venv/bin/torchrun", "--nnodes", "2", "--node-rank", "1"]
    joined = shlex.join(argv)
    assert "--nproc-per-node 4 --master-addr 10.0.0.1 --master-port 29501" in joined
    assert "--max-restarts 0" in joined
    assert "--log-dir /home/alice/.clustertrain/jobs/20260101-000000-abcdef/torchrun-logs" in joined
    assert argv[-3:] == ["train.py", "--lr", "0.1"]


def test_torchrun_argv_c10d_and_passthrough() -> None:
    argv = cmd(options=TorchrunOptions(max_restarts=3, rdzv_backend="c10d",
                                       extra=("--monitor-interval=1",))).torchrun_argv()
    joined = shlex.join(argv)
    assert "--master-addr" not in joined
    assert ("--rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29501 "
            "--rdzv-id 20260101-000000-abcdef") in joined
    assert "--max-restarts 3" in joined
    assert argv.index("--monitor-interval=1") < argv.index("train.py")


def test_shell_runs_in_own_session_and_records_pgid() -> None:
    line = cmd().shell()
    words = shlex.split(line)
    # Private by default: the job's files are its user's alone (umask 077).
    assert words[:5] == ["umask", "077;", "mkdir", "-p",
                         "/home/alice/.clustertrain/jobs/20260101-000000-abcdef"]
    assert "cd /home/alice/.clustertrain/code/20260101-000000-abcdef" in line
    i = words.index("setsid")
    assert words[i + 1:i + 4] == ["-w", "/bin/sh", "-c"]
    inner = words[i + 4]
    assert inner.startswith("echo $$ > /home/alice/.clustertrain/jobs/20260101-000000-abcdef/pgid;")
    assert ". /etc/clustertrain/cluster.env" in inner
    assert "PYTHONUNBUFFERED=1" in inner and "FOO='a b'" in inner
    assert "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:'" in inner
    assert inner.endswith(shlex.join(cmd().torchrun_argv()))
    # torchrun's exit status is the session's last line, then its exit code.
    assert line.endswith('echo "@@clustertrain-exit $rc"; exit $rc; }')


def test_the_exit_marker_is_taken_out_of_the_log() -> None:
    from orchestrator.job import _take_exit_marker

    lines = ["node0/rank0 | done", "node0/torchrun | @@clustertrain-exit 3"]
    assert _take_exit_marker(lines, None) == (["node0/rank0 | done"], 3)
    # Output that did not end with a newline keeps its text.
    assert _take_exit_marker(["node0/torchrun | partial@@clustertrain-exit 0"], None) == (
        ["node0/torchrun | partial"], 0)
    assert _take_exit_marker(["node0/rank1 | no marker"], None) == (
        ["node0/rank1 | no marker"], None)


def test_shell_quotes_hostile_arguments() -> None:
    words = shlex.split(cmd(script_args=("$(touch /tmp/pwned)", "a;b")).shell())
    inner = words[words.index("-c") + 1]
    assert shlex.split(inner.rsplit("exec ", 1)[1])[-2:] == ["$(touch /tmp/pwned)", "a;b"]


@pytest.mark.parametrize("items, expected", [
    (None, {}),
    (["A=1", "B=x=y", "EMPTY="], {"A": "1", "B": "x=y", "EMPTY": ""}),
    (["_X9=hello world"], {"_X9": "hello world"}),
])
def test_parse_env(items, expected) -> None:
    assert parse_env(items) == expected


@pytest.mark.parametrize("bad", ["NOEQUALS", "=v", "9X=1", "A-B=1", "A B=1"])
def test_parse_env_rejects(bad: str) -> None:
    with pytest.raises(LaunchError, match=r"--env .* is not KEY=VALUE.*--env LR=0.1"):
        parse_env([bad])
