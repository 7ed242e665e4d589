"""A detached run recovers on its nodes (node/recover.py), run for real on this machine:
real supervisors and a real standby, a temporary directory standing in for the share,
a node's death a SIGKILL of its supervisor's whole session."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.node import cordon, protocol, recover
from orchestrator.node.protocol import End

KEY = b"k" * 32   # the run's ring key (the launch makes a random one)

NODE = [sys.executable, "-m", "orchestrator.node"]
# The job: says its attempt; the first attempt works until told (a file DEAD in the
# working directory), then fails, as gloo's ranks fail when a peer's sockets break; a
# recovery works SECONDS and ends well.
JOB = ("import os, sys, time\n"
       "attempt = os.environ.get('CLUSTERTRAIN_RECOVERY')\n"
       "print('attempt', attempt, 'rank', os.environ['CLUSTERTRAIN_NODE_RANK'], flush=True)\n"
       "if attempt == '0':\n"
       "    while not os.path.exists('dead'):\n"
       "        time.sleep(0.1)\n"
       "    sys.exit(1)\n"
       "time.sleep(float(sys.argv[1]))\n")


def template(tmp: Path, seconds: float) -> str:
    """A launch line as NodeCommand.shell() makes one (that the filled-in template is that
    line is tests/orchestrator/run/test_recovery.py's), with this machine's package."""
    t = protocol.TEMPLATE
    argv = [*NODE, "supervise", "--wait-go", "--job", f"{tmp}/{t['node']}/{t['run']}",
            "--state-dir", t["state"], "--run", t["run"], "--node", t["node"],
            "--nodes", t["nodes"], "--addresses", t["addresses"], "--grace", "1",
            "--recovery", "--", sys.executable, "-c", JOB, str(seconds)]
    return (f"mkdir -p {tmp}/{t['node']}/{t['run']} && cd {tmp} && "
            f"export CLUSTERTRAIN_RECOVERY={t['attempt']} CLUSTERTRAIN_RUN_ID={t['run']} "
            f"CLUSTERTRAIN_NODE_RANK={t['rank']} "
            f"PYTHONPATH={shlex.quote(os.getcwd())} && exec {shlex.join(argv)}")


def plan(tmp: Path, spares: list[str], most: int = 1, seconds: float = 2.0,
         min_nodes: int | None = None) -> dict:
    share = tmp / "share"
    (share / cordon.CORDONS_SUBDIR).mkdir(parents=True, exist_ok=True)
    state = share / "runs" / "R"
    names = ["n0", "n1", *spares]
    made = {"run_id": "R", "state": str(state), "template": template(tmp, seconds),
            "max_recoveries": most, "min_nodes": min_nodes, "nodes": ["n0", "n1"],
            "spares": spares, "addresses": {n: "127.0.0.1" for n in names},
            "spare_facts": {}, "share": str(share), "drain": False, "synced": False,
            "key": KEY.hex(), "secret_env": {}}
    (state / protocol.RECOVERY_SUBDIR).mkdir(parents=True)
    (state / protocol.RECOVERY_SUBDIR / protocol.PLAN_FILE).write_text(json.dumps(made))
    return made


def stands_by(made: dict, node: str, others: list[str] | None = None, ago: float = 0.0) -> None:
    """What NODE's standby says on the share (say_ready), AGO seconds ago."""
    Path(recover.standby_path(made["state"], node)).write_text(
        json.dumps({"at": time.time() - ago, "others": others or []}))


def start(tmp: Path, made: dict, node: str) -> None:
    """NODE's part of the first attempt, launched as the controller launches it."""
    line = recover.fill(made, {"attempt": 0, "run_id": "R", "nodes": made["nodes"],
                               "addresses": ["127.0.0.1"] * 2}, node, "py", "tr", "/h")
    done = subprocess.run(["sh", "-c", line], input=protocol.GoWord(KEY).line(),
                          capture_output=True, text=True, timeout=60)
    assert protocol.STARTED in done.stdout, done.stderr


def wait_json(path: Path, timeout: float, want=lambda data: True) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = json.loads(path.read_text())
            if want(data):
                return data
        except (OSError, ValueError):
            pass
        assert time.monotonic() < deadline, f"{path} never said what was awaited"
        time.sleep(0.2)


def kill_node(tmp: Path, node: str, run: str) -> None:
    """NODE dies: its supervisor and torchrun, every process, at once."""
    pid = int((tmp / node / run / protocol.SUPERVISOR_PID).read_text())
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    pgid = int((tmp / node / run / protocol.PGID_FILE).read_text())
    os.killpg(pgid, signal.SIGKILL)


def standby(tmp: Path, made: dict, node: str) -> subprocess.Popen:
    return subprocess.Popen([*NODE, "standby", "--plan", str(
        Path(made["state"]) / protocol.RECOVERY_SUBDIR / protocol.PLAN_FILE), "--node", node,
        "--torchrun", "unused", "--log", str(tmp / f"{node}-standby.log")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()})


def test_a_lost_node_is_replaced_by_the_spare_on_the_nodes_alone(tmp_path: Path) -> None:
    """n1 dies with nobody attached: n0 names it lost, cordons it, writes the decision; n0
    and the spare n2 (its standby) start attempt R.r1, which runs to its end. (The spare's
    standby looks at this whole machine: another user's run here, a sandbox node's, would
    make it pass the spare over, as it should; make test runs no sandbox beside the unit
    tests.)"""
    made = plan(tmp_path, ["n2"])
    spare = standby(tmp_path, made, "n2")
    try:
        start(tmp_path, made, "n0")
        start(tmp_path, made, "n1")
        state = Path(made["state"])
        wait_json(state / "n1.json", 30)
        wait_json(state / "n0.json", 30)
        kill_node(tmp_path, "n1", "R")
        (tmp_path / "dead").touch()   # n0's ranks fail at once: their peer is gone
        decision = wait_json(Path(recover.next_path(str(state))), protocol.PEER_TIMEOUT + 20)
        assert (decision["attempt"], decision["run_id"], decision["node"], decision["spare"],
                decision["nodes"], decision["decided_by"]) == (
            1, "R.r1", "n1", "n2", ["n0", "n2"], "n0"), decision
        assert decision["why"].startswith("lost") and decision["cordoned"], decision
        assert (cordon.current(made["share"], "n1") or {}).get("run") == "R"
        second = state.parent / "R.r1"
        ends = {n: wait_json(second / f"{n}.json", 60, lambda s: s.get("state") == "ended")
                for n in ("n0", "n2")}
        assert {n: (e["reason"], e["code"]) for n, e in ends.items()} == {
            "n0": ("exited", 0), "n2": ("exited", 0)}, ends
        for node, rank in (("n0", "0"), ("n2", "1")):
            log = (tmp_path / node / "R.r1" / protocol.OUTPUT_LOG).read_text()
            assert f"attempt 1 rank {rank}" in log, log
        spare.wait(timeout=30)
        assert spare.returncode == 0
    finally:
        spare.kill()
        subprocess.run(["pkill", "-9", "-f", f"{tmp_path}/n"], check=False)


def test_a_script_that_fails_on_every_node_is_not_recovered(tmp_path: Path) -> None:
    """Every node's ranks fail and no node is lost: the script's own failure, ended at
    once (no wait for a lost node), with no next attempt."""
    made = plan(tmp_path, [])
    start(tmp_path, made, "n0")
    start(tmp_path, made, "n1")
    state = Path(made["state"])
    wait_json(state / "n0.json", 30)
    wait_json(state / "n1.json", 30)
    told = time.monotonic()
    (tmp_path / "dead").touch()
    ends = {n: wait_json(state / f"{n}.json", 30, lambda s: s.get("state") == "ended")
            for n in ("n0", "n1")}
    assert time.monotonic() - told < protocol.PEER_TIMEOUT / 2
    assert {n: (e["reason"], e["code"]) for n, e in ends.items()} == {
        "n0": ("exited", 1), "n1": ("exited", 1)}, ends
    time.sleep(2)
    assert not Path(recover.next_path(made["state"])).exists()


def test_recoveries_used_up_end_the_run_with_no_next_attempt(tmp_path: Path) -> None:
    """The last allowed attempt loses a node: no next attempt, and the node is cordoned
    all the same (the next run placed on it, anybody's, would fail too)."""
    made = plan(tmp_path, ["n2"], most=1)
    stands_by(made, "n2")
    state = tmp_path / "share" / "runs" / "R.r1"
    state.mkdir(parents=True)
    assert recover.decide(made, str(state), "R.r1", "n0", ["n0", "n1"], "n1", "lost", None) \
        is None
    said = json.loads(Path(recover.next_path(str(state))).read_text())
    assert (said["attempt"], said["node"], said["cordoned"]) == (None, "n1", True), said
    assert (cordon.current(made["share"], "n1") or {}).get("run") == "R.r1"
    # Another survivor reads the same end (the lock was taken), at once.
    assert recover.decide(made, str(state), "R.r1", "n2", ["n0", "n1"], "n1", "lost",
                          None) is None


def test_without_a_spare_the_healthy_nodes_go_on_when_min_nodes_allows(
        tmp_path: Path) -> None:
    made = plan(tmp_path, [], min_nodes=1)
    decision = recover.decide(made, made["state"], "R", "n0", ["n0", "n1"], "n1",
                              "lost (x)", 1.0)
    assert decision is not None and (decision["nodes"], decision["spare"]) == (["n0"], None)
    # Another survivor reads the same decision: the lock was taken.
    assert recover.decide(made, made["state"], "R", "n1", ["n0", "n1"], "n1", "lost",
                          None) == decision


def test_no_spare_and_too_few_nodes_writes_why_and_starts_nothing(tmp_path: Path) -> None:
    made = plan(tmp_path, [], min_nodes=2)
    assert recover.decide(made, made["state"], "R", "n0", ["n0", "n1"], "n1", "lost",
                          None) is None
    said = json.loads(Path(recover.next_path(made["state"])).read_text())
    assert said["attempt"] is None and said["node"] == "n1" and said["cordoned"]


def test_a_cordoned_spare_is_passed_over(tmp_path: Path) -> None:
    made = plan(tmp_path, ["n2", "n3"])
    stands_by(made, "n2")
    stands_by(made, "n3")
    cordon.record(made["share"], "n2", cordon.CORDON, "bad fan")
    assert recover.next_nodes(made, ["n0", "n1"], "n1") == (["n0", "n3"], "n3")


def test_a_spare_another_user_works_on_is_passed_over(tmp_path: Path, capsys) -> None:
    """The node that decides cannot see bob's notebook on the spare; the spare's standby
    can, and says so: alice's recovery takes the next spare, or none."""
    made = plan(tmp_path, ["n2", "n3"])
    stands_by(made, "n2", ["bob's notebook 20260101-000000-abcdef"])
    stands_by(made, "n3")
    assert recover.next_nodes(made, ["n0", "n1"], "n1") == (["n0", "n3"], "n3")
    assert "spare n2 passed over: in use by bob's notebook" in capsys.readouterr().out
    stands_by(made, "n3", ["bob's GPU process 4242"])
    assert recover.next_nodes(made, ["n0", "n1"], "n1") is None


def test_a_spare_whose_standby_is_silent_is_passed_over(tmp_path: Path, capsys) -> None:
    """A spare whose node went down (its standby with it) would never start its part."""
    made = plan(tmp_path, ["n2", "n3", "n4"], min_nodes=1)
    stands_by(made, "n2", ago=recover.STANDBY_STALE + 5)
    stands_by(made, "n4")
    assert recover.next_nodes(made, ["n0", "n1"], "n1") == (["n0", "n4"], "n4")
    out = capsys.readouterr().out
    assert "spare n2 passed over: no word from its standby for" in out
    assert "spare n3 passed over: its standby never said it was ready" in out
    Path(recover.standby_path(made["state"], "n4")).write_text("{not json")
    assert recover.next_nodes(made, ["n0", "n1"], "n1") == (["n0"], None)   # --min-nodes 1


@pytest.mark.skipif(os.getuid() != 0, reason="starts a process as another user: needs root")
def test_a_standby_names_another_users_notebook_on_its_node(tmp_path: Path) -> None:
    """say_ready on a real process table: a notebook's supervisor of another user (nobody)
    is named; the run's own user's work and the run itself are not."""
    made = plan(tmp_path, ["n2"])

    def supervisor(run: str) -> list[str]:   # what busy.scan takes for a notebook's
        return ["/usr/bin/python3", "-c", "import time; time.sleep(300)", "/h/node.py",
                "supervise", "--job", "/h/j", "--run", run, "--", "python3", "-m",
                protocol.NOTEBOOK_MODULE]

    theirs = subprocess.Popen(supervisor("20260101-000000-b0b0b0"), user="nobody", cwd="/")
    mine = subprocess.Popen(supervisor("20260101-000000-a1a1a1"))
    try:
        deadline = time.monotonic() + 10
        while True:
            recover.say_ready(made, "n2")
            said = json.loads(Path(recover.standby_path(made["state"], "n2")).read_text())
            if said["others"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        # (Other users' runs on this machine, a sandbox's nodes' say, are named too.)
        assert "nobody's notebook 20260101-000000-b0b0b0" in said["others"], said
        assert not [o for o in said["others"] if "a1a1a1" in o], said
        assert "nobody's notebook 20260101-000000-b0b0b0" in (
            recover.unfit(made, "n2", time.time()) or "")
    finally:
        theirs.kill()
        mine.kill()


@pytest.mark.parametrize(("reason", "peer", "why"), [
    (End.PEER_LOST, {}, "lost (no word from it for 15 s)"),
    (End.PEER_FAILED, {"reason": "supervisor-failed", "why": "OSError"},
     "its supervisor failed (OSError)"),
    (End.PEER_FAILED, {"reason": "exited", "code": 137}, "its torchrun was killed (SIGKILL)"),
    (End.PEER_FAILED, {"reason": "exited", "code": 1}, None),      # the script's failure
    (End.PEER_FAILED, {"reason": "exited", "code": 143}, None),    # a stop
    (End.STOPPED, {}, None),
    (End.HUNG, {}, None),
])
def test_only_a_nodes_fault_is_recovered(reason, peer, why) -> None:
    assert recover.fault(reason, "n1", peer) == why


def test_a_value_that_needs_quoting_is_refused(tmp_path: Path) -> None:
    made = plan(tmp_path, [])
    with pytest.raises(ValueError, match="quoting"):
        recover.fill(made, {"attempt": 1, "run_id": "R.r1", "nodes": ["n0", "n 1"],
                            "addresses": ["127.0.0.1", "127.0.0.1"]}, "n0", "", "", "/h")
