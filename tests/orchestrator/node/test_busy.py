"""Who else uses a node (orchestrator/node/busy.py): nvidia-smi's answers read from test
doubles in its format (nvidia_smi/: no GPU here), and this machine's /proc with
a real supervisor started by the test, as the launch starts one."""

from __future__ import annotations

import getpass
import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.node import busy
from orchestrator.node.terminate import stop_tree

from ..local_node import installed

DOUBLES = Path(__file__).resolve().parent / "nvidia_smi"
UUIDS = [line.split(", ")[1] for line in
         (DOUBLES / "query-gpu.4gpu.csv").read_text().splitlines()]


def fake_smi(tmp_path: Path, apps: str, gpus: Path = DOUBLES / "query-gpu.4gpu.csv",
             fails: bool = False) -> Path:
    """An nvidia-smi test double on its own PATH entry: answers the two queries busy.py
    makes with APPS and GPUS (or fails as a driver that does not answer)."""
    (tmp_path / "apps.csv").write_text(apps)
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n" + ("echo 'NVIDIA-SMI has failed because it couldn'\\''t communicate "
                         "with the NVIDIA driver.' >&2; exit 9\n" if fails else "") +
        f'case "$1" in\n  --query-compute-apps=pid,gpu_uuid,used_memory) cat '
        f'{tmp_path / "apps.csv"} ;;\n  --query-gpu=index,uuid) cat {gpus} ;;\n'
        '  *) echo "unexpected: $*" >&2; exit 2 ;;\nesac\n')
    smi.chmod(0o755)
    return smi


def test_the_gpus_and_their_processes_as_nvidia_smi_prints_them() -> None:
    gpus = busy.parse_gpus((DOUBLES / "query-gpu.4gpu.csv").read_text())
    assert gpus == {u: i for i, u in enumerate(UUIDS)}
    rows = busy.parse_apps((DOUBLES / "query-compute-apps.4gpu.csv").read_text(), gpus)
    assert [(r.pid, r.gpu, r.used_mib) for r in rows] == [
        (1838461, 0, 15830), (1838462, 1, 15830), (2290117, 2, 2048), (2290117, 3, 512),
        (3011554, 3, None)]
    assert busy.parse_apps((DOUBLES / "query-compute-apps.idle.csv").read_text(), gpus) == []
    assert busy.parse_apps("No running processes found\n", gpus) == []
    # A GPU nvidia-smi's list does not have (a MIG instance, say): its UUID, no index.
    [odd] = busy.parse_apps("77, MIG-1d2e3f, 100\n", gpus)
    assert (odd.gpu, odd.uuid) == (None, "MIG-1d2e3f")


def test_what_a_real_nvidia_smi_printed_for_a_process_on_its_gpu() -> None:
    """Captured on an H200 (bench/gpu_checks.py): a process holding 1 GiB of GPU 0."""
    gpus = busy.parse_gpus((DOUBLES / "query-gpu.h200.csv").read_text())
    assert gpus == {"GPU-91b0e7a6-07ac-eff8-f2e7-117f99db2d6d": 0}
    [row] = busy.parse_apps((DOUBLES / "query-compute-apps.h200.csv").read_text(), gpus)
    assert (row.pid, row.gpu, row.used_mib) == (669, 0, 1542)


def test_no_nvidia_smi_is_a_node_without_gpu_processes(tmp_path: Path) -> None:
    assert busy.gpu_processes(str(tmp_path / "nvidia-smi")) == ([], None)


def test_an_nvidia_smi_that_fails_says_why(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, "", fails=True)
    assert busy.gpu_processes(str(smi)) == (
        [], "nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory: NVIDIA-SMI has failed "
        "because it couldn't communicate with the NVIDIA driver.")


def test_a_supervisors_command_line_names_its_run() -> None:
    from orchestrator.run.command import NodeCommand

    # The very line the launch runs on a node (run/command.py), after the shell's exec.
    line = NodeCommand(run_id="20260101-000000-abcdef", node_rank=0, nnodes=2, nproc=1,
                       master_addr="10.0.0.1", master_port=29500, torchrun="/v/bin/torchrun",
                       home="/home/alice", script="train.py", script_args=("--run", "x"),
                       node="node0", nodes=("node0", "node1"), run_state="/s").shell()
    argv = shlex.split(line.split("exec ", 1)[1])
    assert busy.supervised_run(argv) == "20260101-000000-abcdef"
    assert busy.kind_of(argv) == "run"
    notebook = NodeCommand(run_id="20260101-000000-abcdef", node_rank=0, nnodes=1, nproc=1,
                           master_addr="10.0.0.1", master_port=29500,
                           torchrun="/v/bin/torchrun", home="/home/bob",
                           script="orchestrator.node.notebook", module=True, node="node1",
                           nodes=("node1",), run_state="/s").shell()
    assert busy.kind_of(shlex.split(notebook.split("exec ", 1)[1])) == "notebook"
    assert busy.supervised_run([sys.executable, "-m", "orchestrator.node", "supervise",
                                "--job", "j", "--run=r7", "--", "torchrun"]) == "r7"
    # Not a supervisor: the shell that starts one, a follower, a script's own --run.
    assert busy.supervised_run(["bash", "-c", line]) is None
    assert busy.supervised_run(["python3", "/h/node.py", "follow", "--job", "j"]) is None
    assert busy.supervised_run(["python", "train.py", "supervise", "--run", "x"]) is None
    # srun starting a supervisor as a Slurm step: that supervisor is the run's, not srun
    assert busy.supervised_run(["srun", "--jobid=7", "/usr/bin/python3", "-S", "/h/node.py",
                                "supervise", "--in-step", "--run", "x"]) is None
    assert busy.supervised_run(["python3", "/h/node.py", "supervise", "--job", "j", "--",
                                "torchrun", "--run", "x"]) is None


def wait_for(predicate, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return found


def probed_runs(tmp_path: Path, run: str | None) -> list[str]:
    """The runs preflight's probe (`node.py probe`) finds here, asked for RUN."""
    request: dict[str, object] = {"shared": {"path": str(tmp_path), "fstypes": None},
                                  "addresses": [], "port": None, "run": run,
                                  "state_dir": str(tmp_path / "state")}
    p = subprocess.run([sys.executable, "-m", "orchestrator.node", "probe"],
                       input=json.dumps(request), capture_output=True, text=True, timeout=120,
                       check=True)
    return [r["run"] for r in json.loads(p.stdout.splitlines()[-1])["busy"]["runs"]]


def test_a_live_supervisor_is_a_run_and_its_end_is_not(tmp_path: Path) -> None:
    """A real supervisor (the node package installed as on a node, started as the launch
    starts it) over a stand-in torchrun: its run is found by its process, with its owner;
    the GPU processes under it count for it, a process of no run counts alone. Once it
    ended, its state files stay and the run is gone."""
    run = f"20260101-000000-{secrets.token_hex(3)}"
    job, shared = tmp_path / "job", tmp_path / "shared"
    job.mkdir()
    entry = installed(tmp_path / "home")
    sup = subprocess.Popen(
        [sys.executable, str(entry), "supervise", "--job", str(job), "--state-dir",
         str(shared), "--run", run, "--node", "n0", "--nodes", "n0", "--grace", "1",
         "--keep-runs", "0", "--", sys.executable, "-c", "import time; time.sleep(300)"],
        env={**os.environ, "CLUSTERTRAIN_RUN_ID": run}, start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        torchrun = int(wait_for(lambda: (job / "pgid").exists()
                                and (job / "pgid").read_text().strip()))
        smi = fake_smi(tmp_path, f"{torchrun}, {UUIDS[1]}, 1024\n{torchrun}, {UUIDS[0]}, 1024\n"
                                 f"{other.pid}, {UUIDS[3]}, 300\n")
        found = busy.scan(smi=str(smi))
        [mine] = [r for r in found.runs if r.run == run]
        assert (mine.user, mine.pids, mine.gpus) == (getpass.getuser(), [sup.pid], [0, 1])
        [bare] = found.gpu_processes
        assert (bare.pid, bare.gpu, bare.used_mib, bare.user) == (
            other.pid, 3, 300, getpass.getuser())
        assert bare.command == f"{sys.executable} -c import time; time.sleep(300)"
        # The run being launched is left out, its GPU processes too.
        again = busy.scan(exclude=run, smi=str(smi))
        assert run not in [r.run for r in again.runs]
        assert [g.pid for g in again.gpu_processes] == [other.pid]
        assert json.loads(json.dumps(found.to_json())) == found.to_json()
        assert busy.Busy.from_json(found.to_json()) == found
        # Preflight's probe says the same, leaving out the run it is asked for.
        assert run in probed_runs(tmp_path, None) and run not in probed_runs(tmp_path, run)
    finally:
        other.kill()
        stop_tree(str(job), run, 1.0)
        sup.wait(timeout=30)
    assert json.loads((shared / "n0.json").read_text())["state"] == "ended"
    (shared / "n0.json").write_text(json.dumps({"state": "running", "user": "alice"}))
    assert run not in [r.run for r in busy.scan(smi=str(tmp_path / "none")).runs]


@pytest.mark.skipif(os.getuid() != 0, reason="starts a process as another user: needs root")
def test_another_users_run_is_found_with_its_owner() -> None:
    """A real supervisor of another user (nobody, with the system's python3), from the
    node package installed in that user's home: found by any user, named with its owner."""
    import pwd
    import shutil
    import signal
    import tempfile

    run = f"20260101-000000-{secrets.token_hex(3)}"
    home = Path(tempfile.mkdtemp(prefix="ct-busy-", dir="/tmp"))
    try:
        entry = installed(home)
        (home / "job").mkdir()
        nobody = pwd.getpwnam("nobody")
        for d, _, files in os.walk(home):
            for path in [d, *(os.path.join(d, f) for f in files)]:
                os.chown(path, nobody.pw_uid, nobody.pw_gid)
        sup = subprocess.Popen(
            ["/usr/bin/python3", str(entry), "supervise", "--job", str(home / "job"),
             "--state-dir", str(home / "shared"), "--run", run, "--node", "n0", "--nodes",
             "n0", "--keep-runs", "0", "--", "/bin/sleep", "300"],
            user="nobody", cwd=home, env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
            start_new_session=True)
        pgid = None
        try:
            pgid = int(wait_for(lambda: (home / "job" / "pgid").exists()
                                and (home / "job" / "pgid").read_text().strip()))
            [theirs] = [r for r in busy.scan().runs if r.run == run]
            assert (theirs.user, theirs.pids) == ("nobody", [sup.pid])
        finally:
            sup.kill()
            sup.wait()
            if pgid is not None:   # the stand-in torchrun, in a session of its own
                os.killpg(pgid, signal.SIGKILL)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_the_busy_verb_answers_in_json(tmp_path: Path) -> None:
    fake_smi(tmp_path, (DOUBLES / "query-compute-apps.4gpu.csv").read_text())
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    p = subprocess.run([sys.executable, "-m", "orchestrator.node", "busy", "--exclude", "r0"],
                       capture_output=True, text=True, timeout=60, env=env, check=True)
    out = busy.Busy.from_json(json.loads(p.stdout))
    assert [(g.pid, g.gpu) for g in out.gpu_processes] == [
        (1838461, 0), (1838462, 1), (2290117, 2), (2290117, 3), (3011554, 3)]
    assert out.error is None
