"""The per-node torchrun command line and --env parsing."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cluster import nodelib
from orchestrator.errors import LaunchError
from orchestrator.run.command import NodeCommand, TorchrunOptions, parse_env


def cmd(**kw) -> NodeCommand:
    base: dict[str, Any] = dict(run_id="20260101-000000-abcdef", node_rank=1, nnodes=2, nproc=4,
                master_addr="10.0.0.1", master_port=29501,
                torchrun="/opt/clustertrain/venv/bin/torchrun", home="/home/alice",
                script="train.py",
                script_args=("--lr", "0.1"), env={"FOO": "a b"}, node="node1",
                nodes=("node0", "node1"),
                run_state="/srv/clustertrain/runs/alice/20260101-000000-abcdef")
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


def test_shell_starts_the_supervisor_waiting_for_the_word() -> None:
    c = cmd(node="node1", nodes=("node0", "node1"), run_state="/mnt/cluster/checkpoints/"
            "alice/.clustertrain/runs/20260101-000000-abcdef", lease_timeout=20.0)
    line = c.shell()
    words = shlex.split(line)
    job = "/home/alice/.clustertrain/jobs/20260101-000000-abcdef"
    # Private by default: the job's files are its user's alone (umask 077).
    assert words[:5] == ["umask", "077;", "mkdir", "-p", job]
    # The supervisor is the node package's, from this version's directory on the node:
    # no program's source travels on the command line or the input.
    lib = f"/home/alice/.clustertrain/lib/{nodelib.bundle().version}"
    assert "python3 -c" not in line and "head -c" not in line and len(line) < 4000
    assert ". /etc/clustertrain/cluster.env" in line
    assert "PYTHONUNBUFFERED=1" in line and "FOO='a b'" in line
    assert "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:'" in line
    i = words.index("exec")
    sup = words[i + 1:words.index("--", i)]
    assert sup[:5] == ["/usr/bin/python3", "-S", f"{lib}/node.py", "supervise", "--wait-go"]
    for flag, value in (("--node", "node1"), ("--nodes", "node0,node1"),
                        ("--lease-timeout", "20.0"), ("--run", "20260101-000000-abcdef"),
                        ("--cwd", "/home/alice/.clustertrain/code/20260101-000000-abcdef")):
        assert sup[sup.index(flag) + 1] == value
    assert "--attached" in sup
    rest = words[words.index("--", i) + 1:]
    assert rest == c.torchrun_argv()
    assert "--attached" not in shlex.split(cmd(attached=False).shell())


def test_a_command_without_its_node_or_state_directory_is_refused() -> None:
    with pytest.raises(ValueError, match="lacks run_state"):
        cmd(run_state="")
    with pytest.raises(ValueError, match="lacks node, nodes"):
        cmd(node="", nodes=())


def test_follow_reads_the_node_log_and_holds_the_lease() -> None:
    job = "/home/alice/.clustertrain/jobs/20260101-000000-abcdef"
    lib = f"/home/alice/.clustertrain/lib/{nodelib.bundle().version}"
    assert shlex.split(cmd().follow(lease=True)) == [
        "/usr/bin/python3", f"{lib}/node.py", "follow", "--job", job, "--lease"]
    assert shlex.split(cmd().follow(tail=5))[-2:] == ["--tail", "5"]
    assert shlex.split(cmd().follow(from_line=7))[-2:] == ["--from-line", "7"]
    assert "--from-line" not in cmd().follow(from_line=0)


def test_a_command_survives_its_record() -> None:
    c = cmd(node="node1", nodes=("node0", "node1"), options=TorchrunOptions(extra=("--x",)))
    assert NodeCommand.from_record(c.to_record()) == c


def test_the_exit_marker_is_taken_out_of_the_log() -> None:
    from orchestrator.run.job import take_exit_marker

    lines = ["node0/rank0 | done", "node0/torchrun | @@clustertrain-exit 3 peer-failed node2"]
    assert take_exit_marker(lines, None) == (["node0/rank0 | done"], (3, "peer-failed", "node2"))
    # Output that did not end with a newline keeps its text.
    assert take_exit_marker(["node0/torchrun | partial@@clustertrain-exit 0 exited -"],
                            None) == (["node0/torchrun | partial"], (0, "exited", ""))
    # Why, in words: the whole rest of the line (a Slurm job's end names the job).
    assert take_exit_marker(["node1/torchrun | @@clustertrain-exit 1 stopped its Slurm job 7 "
                             "ended (scancel, or its time limit)"], None)[1] == (
        1, "stopped", "its Slurm job 7 ended (scancel, or its time limit)")
    assert take_exit_marker(["node0/rank1 | no marker"], None) == (
        ["node0/rank1 | no marker"], None)


def test_a_queued_runs_supervisor_is_started_as_a_step_of_its_slurm_job() -> None:
    """With the run's Slurm job, the node's launch line starts the same supervisor through
    srun, as one task of a step on this node beside the job's other steps, told that it
    runs in a step; srun outlives the SSH session that started it (no SIGHUP, no SIGPIPE
    once that session is gone). Without a job, no srun."""
    c = cmd(node="node1", nodes=("node0", "node1"))
    line = c.shell(slurm_job="42")
    setup, _, step = line.partition("; trap '' HUP PIPE; exec srun ")
    assert step, line
    assert setup == c.shell().partition("; exec ")[0]   # the same umask, job dir, exports
    words = shlex.split("srun " + step)
    srun = words[:words.index(c.python)]
    assert {"--jobid=42", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=node1"} <= set(
        srun), srun
    supervisor = words[len(srun):]
    plain = shlex.split(c.shell().partition("; exec ")[2])
    assert supervisor == [*plain[:5], "--in-step", *plain[5:]]
    assert "srun" not in c.shell() and "--in-step" not in c.shell()


def test_shell_quotes_hostile_arguments() -> None:
    c = cmd(script_args=("$(touch /tmp/pwned)", "a;b"))
    words = shlex.split(c.shell())
    start = words.index("--", words.index("exec")) + 1
    argv = words[start:start + len(c.torchrun_argv())]
    # Each argument reaches torchrun as one word, unexpanded.
    assert argv == c.torchrun_argv() and argv[-2:] == ["$(touch /tmp/pwned)", "a;b"]


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


def test_workers_start_through_the_runner_of_the_node_package() -> None:
    log_dir = "/home/alice/.clustertrain/jobs/20260101-000000-abcdef/torchrun-logs"
    runner = f"/home/alice/.clustertrain/lib/{nodelib.bundle().version}/node.py"
    argv = cmd().torchrun_argv()
    assert argv[argv.index("--log-dir") + 1:] == [
        log_dir, runner, "worker", "train.py", "--lr", "0.1"]
    argv = cmd(script="pkg.train", module=True).torchrun_argv()
    assert argv[argv.index("--log-dir") + 2:] == [
        runner, "worker", "-m", "pkg.train", "--lr", "0.1"]
    # --no-clean-exit: torchrun runs the script (or the module, torchrun's own -m) itself.
    argv = cmd(clean_exit=False).torchrun_argv()
    assert argv[argv.index("--log-dir") + 2:] == ["train.py", "--lr", "0.1"]
    argv = cmd(script="pkg.train", module=True, clean_exit=False).torchrun_argv()
    assert argv[argv.index("--log-dir") + 2:] == ["-m", "pkg.train", "--lr", "0.1"]
    # The run record keeps both, so that `attach` rebuilds the same command.
    again = NodeCommand.from_record(cmd(module=True, clean_exit=False).to_record())
    assert (again.module, again.clean_exit) == (True, False)


def test_the_sync_copies_the_code_alone(tmp_path) -> None:
    """The worker runner comes with the node package, not in the snapshot."""
    from orchestrator.run.sync import sync_playbook

    [play] = sync_playbook(tmp_path / "code", "r1")
    copies = [t for t in play["tasks"] if "ansible.posix.synchronize" in t]
    assert [t["ansible.posix.synchronize"]["src"] for t in copies] == [f"{tmp_path / 'code'}/"]


def test_the_syncs_rsync_reaches_a_node_as_the_orchestrator_does(tmp_path) -> None:
    """rsync's --rsh is the orchestrator's SSH to the node (a paramiko node's proxy
    command included), quoted for synchronize's shlex and then for rsync's own split."""
    import shlex

    from orchestrator.cluster.inventory import Cluster, NodeSpec
    from orchestrator.cluster.ssh import SshTarget
    from orchestrator.run.sync import RSH_VAR, rsh, sync_playbook

    target = SshTarget("192.0.2.7", user="erin", proxy_command="ssh -W %h:%p jump 'x y'")
    cluster = Cluster(tmp_path / "hosts", (NodeSpec("n0", target, "192.0.2.7"),))
    [after_synchronize] = shlex.split(rsh(cluster, ["n0"], None)["n0"])
    argv = shlex.split(after_synchronize)
    assert argv[0] == "ssh" and "ProxyCommand=ssh -W %h:%p jump 'x y'" in argv
    assert "User=erin" in argv and "BatchMode=yes" in argv
    [play] = sync_playbook(tmp_path / "code", "r1")
    [copy] = [t["ansible.posix.synchronize"] for t in play["tasks"]
              if "ansible.posix.synchronize" in t]
    assert copy["rsync_opts"][-1] == f"--rsh={{{{ {RSH_VAR}[inventory_hostname] }}}}"


def test_a_job_directory_that_cannot_be_made_fails_the_launch(tmp_path: Path) -> None:
    """The launch line run by bash where the job directory cannot be made (`jobs` is a
    file): it fails with mkdir's words and starts nothing, so the launch names the node
    and the cause instead of a follower that finds no job later."""

    home = tmp_path / "home"
    (home / ".clustertrain" / "code" / "r1").mkdir(parents=True)
    (home / ".clustertrain" / "jobs").write_text("not a directory")
    line = cmd(home=str(home), run_id="r1", python="/bin/false").shell()
    p = subprocess.run(["bash", "-c", line], input="", capture_output=True, text=True,
                       timeout=30)
    assert p.returncode != 0 and "started" not in p.stdout
    assert "mkdir" in p.stderr and "Not a directory" in p.stderr, p.stderr


def test_every_run_has_the_flight_recorder_on_and_its_dumps_in_the_job() -> None:
    c = cmd()
    env = c.environment()
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == f"{c.job_dir}/fr/timeout-rank"
    assert env["CLUSTERTRAIN_FR_DIR"] == f"{c.job_dir}/fr"
    # No deprecated names (torch warns about them), and the user's --env wins.
    assert not any(k.startswith("TORCH_NCCL_TRACE") or "DEBUG_INFO" in k for k in env)
    assert cmd(env={"TORCH_FR_BUFFER_SIZE": "0"}).environment()["TORCH_FR_BUFFER_SIZE"] == "0"


def test_every_rank_starts_with_the_fault_handler_unless_the_job_says_otherwise() -> None:
    """A rank killed by SIGSEGV prints its Python stack (tests/orchestrator/run/
    test_train_sandbox.py shows it); --env PYTHONFAULTHANDLER= turns it off."""
    assert cmd().environment()["PYTHONFAULTHANDLER"] == "1"
    assert cmd(env={"PYTHONFAULTHANDLER": ""}).environment()["PYTHONFAULTHANDLER"] == ""
