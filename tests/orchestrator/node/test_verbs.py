"""Every verb of the node package, run as a node runs it: from the copy that
cluster/nodelib.py installs under the user's home (`python3 ~/.clustertrain/lib/<version>/
node.py VERB`), with a home of the test's own. One test per verb; the behaviour behind
each verb is tested at length beside this file (test_supervise, test_stop, test_probe_verbs,
test_carry, test_worker; the dump in diagnosis/test_dumps); the sandbox tests run the
same verbs over SSH."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.node import __main__ as verbs
from orchestrator.node.answers import EnvsAnswer
from orchestrator.node.cordon import CORDON, record
from orchestrator.node.protocol import (
    EXIT_MARKER,
    FINISHED_MARKER,
    HANG_SUBDIR,
    NEXT_FILE,
    PLAN_FILE,
    PORT_CLAIMS_DIR,
    RECOVERY_SUBDIR,
    RUN_ID_ENV,
    STANDBY_IDLE,
    STARTED,
    End,
)
from orchestrator.node.terminate import Tree

from ..local_node import installed, unused_port

PY_SPY = shutil.which("py-spy", path=os.path.dirname(sys.executable))
# A worker for the dump: a child of the job's group leader that carries RANK, as torchrun's.
WORKER = "import time\ndef waiting_in_the_test():\n    time.sleep(300)\nwaiting_in_the_test()\n"
JOB = ("import os, subprocess, sys, time\n"
       f"subprocess.Popen([sys.executable, '-c', {WORKER!r}], env={{**os.environ, 'RANK': '0'}})\n"
       "print('job started', flush=True)\n"
       "time.sleep(300)\n")


class Node:
    """This machine as a node: HOME of its own, the node package installed there."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.entry = installed(home)

    def verb(self, *args: str, stdin: str = "", env: dict[str, str] | None = None,
             bare: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """node.py VERB ARGS, from /, with a Python that sees the copy alone (BARE: no
        site-packages; the torch verb needs the environment's)."""
        python = [sys.executable, "-S", "-E", "-s"] if bare else [sys.executable]
        return subprocess.run([*python, str(self.entry), *args], input=stdin, cwd="/",
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "HOME": str(self.home), **(env or {})})

    def supervise(self, run: str, code: str, state_dir: Path) -> list[str]:
        job = self.home / "jobs" / run
        job.mkdir(parents=True)
        return [sys.executable, str(self.entry), "supervise", "--job", str(job),
                "--state-dir", str(state_dir), "--run", run, "--node", "n0", "--nodes", "n0",
                "--grace", "1", "--", sys.executable, "-c", code]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path / "home")


@pytest.fixture
def running(node: Node, tmp_path: Path) -> Iterator[Path]:
    """A detached run on NODE whose torchrun stand-in has one worker (RANK=0): its job
    directory, once the worker is up. Whatever is left of it is killed afterwards."""
    run = "verbs-r1"
    argv = node.supervise(run, JOB, tmp_path / "shared")
    sup = subprocess.Popen(argv, env={**os.environ, "HOME": str(node.home), RUN_ID_ENV: run},
                           start_new_session=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    job = node.home / "jobs" / run
    deadline = time.monotonic() + 30
    while not ((job / "output.log").exists() and "job started" in
               (job / "output.log").read_text()):
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.05)
    yield job
    for pid in Tree(sup.pid).members():
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    sup.wait(timeout=30)


COVERED: dict[str, str] = {}  # verb: the test of it


def covers(*names: str):
    def mark(test):
        COVERED.update({name: test.__name__ for name in names})
        return test
    return mark


def bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def alive_in_group(pgid: int) -> list[int]:
    """The live processes of group PGID (a zombie is dead: here PID 1 may not reap)."""
    alive = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(entry))
    return alive


def last_json(out: subprocess.CompletedProcess) -> dict | list:
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_verb_has_a_test_here() -> None:
    parser = verbs._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(COVERED) == set(sub.choices) | {"worker"}  # worker: parsed by the script


def test_an_unknown_verb_is_refused_naming_the_verbs_there_are(node: Node) -> None:
    # each program builds its own verb's parser alone; a verb that is none builds them all
    out = node.verb("superviseme", "--job", "j")
    assert out.returncode == 2
    assert "invalid choice: 'superviseme'" in out.stderr
    assert all(f"'{v}'" in out.stderr for v in ("supervise", "follow", "stop", "carry"))


@covers("supervise")
def test_verb_supervise_runs_the_command_and_records_its_end(node: Node, tmp_path: Path) -> None:
    argv = node.supervise("verbs-r0", "print('hello from the job'); raise SystemExit(3)",
                          tmp_path / "shared")
    assert subprocess.run(argv, env={**os.environ, "HOME": str(node.home)},
                          timeout=60).returncode == 0
    job = node.home / "jobs" / "verbs-r0"
    assert json.loads((job / "exit").read_text())["code"] == 3
    shared = json.loads((tmp_path / "shared" / "n0.json").read_text())
    assert (shared["code"], shared["reason"]) == (3, End.EXITED.value)
    assert "hello from the job" in (job / "output.log").read_text()


@covers("follow")
def test_verb_follow_prints_the_output_then_the_exit_marker(node: Node, tmp_path: Path) -> None:
    argv = node.supervise("verbs-r0", "print('hello from the job'); raise SystemExit(3)",
                          tmp_path / "shared")
    subprocess.run(argv, env={**os.environ, "HOME": str(node.home)}, timeout=60, check=True)
    out = node.verb("follow", "--job", str(node.home / "jobs" / "verbs-r0"))
    assert out.returncode == 3, out.stderr   # the job's own
    lines = out.stdout.splitlines()
    assert "hello from the job" in lines[0]
    assert lines[-1].startswith(f"{EXIT_MARKER} 3 {End.EXITED.value}")


@covers("stop")
def test_verb_stop_ends_the_runs_processes(node: Node, running: Path, tmp_path: Path) -> None:
    pgid = int((running / "pgid").read_text())
    said = last_json(node.verb("stop", "jobs", running.name, "1"))
    assert isinstance(said, dict) and said["found"] and said["initial"] and not said["left"]
    deadline = time.monotonic() + 30
    state = tmp_path / "shared" / "n0.json"
    while "reason" not in (ended := json.loads(state.read_text())):
        assert time.monotonic() < deadline, "the supervisor wrote no end"  # it beats till then
        time.sleep(0.05)
    assert not alive_in_group(pgid)
    assert ended["reason"] == End.STOPPED.value


@covers("dump")
def test_verb_dump_reads_every_workers_stack(node: Node, running: Path) -> None:
    assert PY_SPY is not None, "py-spy is a test dependency (pyproject.toml): make test-venv"
    answer = last_json(node.verb("dump", "jobs", running.name, PY_SPY))
    assert isinstance(answer, dict), answer   # every verb answers an object
    entries = answer["ranks"]
    assert isinstance(entries, list) and [e["rank"] for e in entries] == [0], entries
    assert "waiting_in_the_test" in entries[0]["dump"]


@covers("probe", "release")
def test_verb_probe_claims_the_master_port_and_release_drops_the_claim(
        node: Node, tmp_path: Path) -> None:
    run, port = f"verbs-{os.getpid()}", unused_port()
    request = {"shared": {"path": str(tmp_path), "fstypes": None}, "addresses": [],
               "port": port, "span": 200, "run": run, "state_dir": str(tmp_path / "state")}
    found = last_json(node.verb("probe", stdin=json.dumps(request)))
    assert isinstance(found, dict) and found["port_free"] is True and found["free_port"] == port

    def claimed() -> list[str]:
        return [n for n in os.listdir(PORT_CLAIMS_DIR) if n.endswith("." + run)]
    assert claimed(), "the launch's probe claimed no port"
    assert node.verb("release", run).returncode == 0
    assert not claimed()


@covers("reach", "unlisten")
def test_verb_reach_connects_to_node0s_listener_and_unlisten_ends_it(
        node: Node, tmp_path: Path) -> None:
    port = unused_port()
    request = {"shared": {"path": str(tmp_path), "fstypes": None},
               "addresses": ["127.0.0.1"], "port": port, "span": 200, "run": None,
               "state_dir": str(tmp_path / "state"),
               "listen": {"nonce": "v1", "key": "k" * 64, "expect": 3,
                          "address": "127.0.0.1", "timeout": 3, "seconds": 30}}
    listening = last_json(node.verb("probe", stdin=json.dumps(request)))
    assert isinstance(listening, dict) and listening["listener"]["ok"], listening
    got = last_json(node.verb("reach", stdin=json.dumps(
        {"addr": "127.0.0.1", "port": port, "nonce": "v1", "key": "k" * 64, "timeout": 3,
         "token": None})))
    assert isinstance(got, dict) and got["connect"] == {"ok": True, "error": None}
    assert not bindable(port), "one node of three came: node 0 listens on"
    assert node.verb("unlisten", str(port), "v1",
                     stdin=json.dumps({"key": "k" * 64})).returncode == 0
    deadline = time.monotonic() + 10
    while not bindable(port):
        assert time.monotonic() < deadline, "unlisten left the listener on the port"
        time.sleep(0.05)


@covers("busy")
def test_verb_busy_finds_a_live_run_by_its_supervisor(node: Node, running: Path) -> None:
    with open(f"/proc/{int((running / 'pgid').read_text())}/stat") as fh:
        supervisor = int(fh.read().rsplit(")", 1)[1].split()[1])  # torchrun's parent

    def pids(*args: str) -> list[int]:
        said = last_json(node.verb("busy", *args))
        assert isinstance(said, dict)
        return [p for r in said["runs"] if r["run"] == "verbs-r1" for p in r["pids"]]
    assert supervisor in pids()
    assert pids("--exclude", "verbs-r1") == []


@covers("envs")
def test_verb_envs_lists_prunes_and_removes_the_users_environments(node: Node) -> None:
    """From the installed node package, without site-packages (envs.py is standard library
    only); the listing itself is tested in test_envs.py."""
    root = node.home / ".clustertrain" / "envs"
    for made, key in enumerate(("aaaaaaaaaaaa", "bbbbbbbbbbbb")):
        (root / f"proj-{key}").mkdir(parents=True)
        (root / f"proj-{key}" / "env.json").write_text(json.dumps({"name": "proj",
                                                                    "key": key}))
        os.utime(root / f"proj-{key}" / "env.json", (1000 + made, 1000 + made))
    (root / "proj").symlink_to("proj-bbbbbbbbbbbb")
    said = last_json(node.verb("envs"))
    assert isinstance(said, dict)
    assert sorted((e["key"], e["current"]) for e in said["envs"]) == [
        ("aaaaaaaaaaaa", False), ("bbbbbbbbbbbb", True)]
    pruned = EnvsAnswer.from_json(last_json(node.verb("envs", "--name", "proj", "--prune", "1")))
    assert (pruned.removed, pruned.in_use) == ([str(root / "proj-aaaaaaaaaaaa")], {})
    removed = EnvsAnswer.from_json(last_json(node.verb("envs", "--name", "proj", "--rm")))
    assert (removed.removed, removed.in_use) == ([str(root / "proj-bbbbbbbbbbbb")], {})
    assert not root.joinpath("proj").is_symlink()


@covers("allocate")
def test_verb_allocate_says_when_the_node_has_no_slurm(node: Node, tmp_path: Path) -> None:
    """The allocation itself is Slurm's: tests/orchestrator/run/test_queue_sandbox.py asks
    for it on the sandbox's Slurm cluster. Here, a node without Slurm's client."""
    empty = tmp_path / "bin"
    empty.mkdir()
    out = node.verb("allocate", "--name", "clustertrain-r1", "--", "-N", "1",
                    env={"PATH": str(empty)})
    assert out.returncode == 127, out.stderr
    event = json.loads(out.stdout.splitlines()[-1])
    assert event["event"] == "refused"
    assert "no Slurm client" in event["said"][0]


@covers("states")
def test_verb_states_reads_the_nodes_states_and_hang_dumps(node: Node, tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / HANG_SUBDIR).mkdir(parents=True)
    (state / "n0.json").write_text(json.dumps({"code": 1, "reason": "exited"}))
    (state / HANG_SUBDIR / "n0.json").write_text(json.dumps({"node": "n0", "ranks": []}))
    said = last_json(node.verb("states", str(state)))
    assert isinstance(said, dict)
    assert said["states"] == {"n0": {"code": 1, "reason": "exited"}}
    assert said["hang"] == {"n0": {"node": "n0", "ranks": []}}


@covers("du")
def test_verb_du_counts_the_shares_bytes_by_owner_and_kind(node: Node, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.bin").write_bytes(b"\0" * (1 << 20))
    said = last_json(node.verb("du", str(tmp_path)))
    assert isinstance(said, dict) and said["unread"] == []
    assert [k["data"] >= 1 << 20 for k in said["users"].values()] == [True]


@covers("health")
def test_verb_health_reads_the_nodes_verdict_and_the_shares_histories(
        node: Node, tmp_path: Path) -> None:
    """Without a health check here its verdict is None; with --share, every node's history
    and the runs that lost each node (a run's cordon) in the window."""
    (tmp_path / "cordons").mkdir()
    (tmp_path / "health").mkdir()
    (tmp_path / "health" / "n1.jsonl").write_text(json.dumps(
        {"time": 10.0, "node": "n1", "event": "failing", "failures": []}) + "\n")
    record(str(tmp_path), "n2", CORDON, "n2 lost mid-run r1", run="r1")
    said = last_json(node.verb("health", "--share", str(tmp_path), "--since", "5"))
    assert isinstance(said, dict)
    assert said["state"] is None
    assert said["history"] == {"n1": [{"time": 10.0, "node": "n1", "event": "failing",
                                       "failures": []}]}
    assert [r["run"] for r in said["runs_failed"]["n2"]] == ["r1"]
    assert said["cordoned"]["n2"]["why"] == "n2 lost mid-run r1"


@covers("usage")
def test_verb_usage_reads_the_runs_records(node: Node, tmp_path: Path) -> None:
    me = getpass.getuser()   # a record counts for its file's owner (node/usage.py)
    runs = tmp_path / "checkpoints" / me / ".clustertrain" / "runs" / "r1"
    runs.mkdir(parents=True)
    (runs / "n0.json").write_text(json.dumps({"node": "n0", "started": 1000.0,
                                              "ended": 4600.0, "gpus": 2}))
    said = last_json(node.verb("usage", str(tmp_path), "--since", "0"))
    assert isinstance(said, dict)
    assert said["users"] == {me: {"runs": 1, "node_hours": 1.0, "gpu_hours": 2.0,
                                       "idle_gpu_hours": 0.0}}


@covers("recovery-plan", "standby")
def test_verb_standby_follows_the_plan_a_detached_run_recovers_by(node: Node,
                                                                  tmp_path: Path) -> None:
    """recovery-plan writes the plan where the nodes read it; a spare's standby follows
    the decisions on the share and leaves once an attempt that does not name it is over
    (the recovery itself: test_recover.py)."""
    state = tmp_path / "runs" / "R"
    plan = {"run_id": "R", "state": str(state), "template": "exit 1", "max_recoveries": 2,
            "min_nodes": None, "nodes": ["n0", "n1"], "spares": ["n2", "n3"],
            "addresses": {}, "spare_facts": {}, "share": str(tmp_path), "drain": False,
            "synced": False}
    path = state / RECOVERY_SUBDIR / PLAN_FILE
    assert node.verb("recovery-plan", str(path), stdin=json.dumps(plan)).returncode == 0
    assert json.loads(path.read_text()) == plan
    (state / RECOVERY_SUBDIR / NEXT_FILE).write_text(json.dumps(
        {"attempt": 1, "run_id": "R.r1", "nodes": ["n0", "n3"], "addresses": []}))
    (tmp_path / "runs" / "R.r1").mkdir()
    for name in ("n0", "n3"):   # attempt 1 ended well, long ago
        (tmp_path / "runs" / "R.r1" / f"{name}.json").write_text(json.dumps(
            {"state": "ended", "ended": time.time() - STANDBY_IDLE - 5}))
    log = tmp_path / "standby.log"
    out = node.verb("standby", "--plan", str(path), "--node", "n2", "--torchrun", "t",
                    "--log", str(log), "--detach")
    assert out.returncode == 0 and STARTED in out.stdout, out.stderr
    deadline = time.monotonic() + 30
    while "R.r1 ended without a decision that names n2: leaving" not in (
            log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.1)
    said = last_json(node.verb("states", str(state)))
    assert isinstance(said, dict) and said["next"]["run_id"] == "R.r1"


@covers("cordon")
def test_verb_cordon_adds_an_event_and_lists_the_cordoned_nodes(node: Node,
                                                                tmp_path: Path) -> None:
    (tmp_path / "cordons").mkdir()
    request = {"share": str(tmp_path), "node": "n1", "action": "cordon", "why": "lost",
               "run": "r1"}
    said = last_json(node.verb("cordon", stdin=json.dumps(request)))
    assert isinstance(said, dict) and said["event"]["why"] == "lost"
    listed = last_json(node.verb("cordon", stdin=json.dumps({"share": str(tmp_path)})))
    assert isinstance(listed, dict) and list(listed["cordoned"]) == ["n1"]


@covers("torch")
def test_verb_torch_says_what_this_python_sees(node: Node) -> None:
    said = last_json(node.verb("torch", bare=False))
    import torch
    assert isinstance(said, dict)
    assert said["torch_import"] == "ok" and said["version"] == torch.__version__


@covers("carry")
def test_verb_carry_brings_what_the_last_run_wrote(node: Node) -> None:
    code = node.home / ".clustertrain" / "code"
    (code / "r1").mkdir(parents=True)
    (code / "r1" / "train.py").write_text("v1")
    assert last_json(node.verb("carry", str(code), "r1", "w"))["from"] is None  # type: ignore[call-overload]
    (code / "r1" / "snapshot.pt").write_text("epoch 2")   # the job wrote it
    (code / "r2").mkdir()
    (code / "r2" / "train.py").write_text("v2")
    said = last_json(node.verb("carry", str(code), "r2", "w"))
    assert isinstance(said, dict) and said["carried"] == ["snapshot.pt"]
    assert (code / "r2" / "snapshot.pt").read_text() == "epoch 2"


@covers("worker")
def test_verb_worker_runs_the_script_to_a_marked_end(node: Node, tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import sys\nprint('args', sys.argv[1:])\nraise SystemExit(3)\n")
    out = node.verb("worker", str(script), "--lr", "0.1", env={"RANK": "5"})
    assert out.returncode == 3, out.stderr
    assert "args ['--lr', '0.1']" in out.stdout
    assert FINISHED_MARKER.format(rank=5, code=3) in out.stdout + out.stderr
