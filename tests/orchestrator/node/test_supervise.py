"""The node-side supervisor, run for real on this machine: real processes, real signals,
a temporary directory standing in for the shared filesystem."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.node import dump, protocol, slurmjob, supervise, terminate as node_stop, util
from orchestrator.node.ring import Counters, Ring

# The node package's verbs, as a node runs them (`node.py VERB`).
NODE = [sys.executable, "-m", "orchestrator.node"]
# A stand-in for torchrun: a process group leader whose child runs in a session of its
# own (as torchrun's workers do), both sleeping until stopped.
JOB = ("import subprocess, sys, time\n"
       "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
       " start_new_session=True)\n"
       "print('job started', flush=True)\n"
       "time.sleep(float(sys.argv[1]))\n"
       "sys.exit(int(sys.argv[2]))\n")


def start(tmp: Path, node: str, *, seconds: float = 300, code: int = 0, attached: bool = False,
          lease_timeout: float = 30, nodes: str = "n0,n1", run: str = "r1",
          state_dir: Path | None = None, hang: list[str] | None = None,
          job_code: str = JOB) -> subprocess.Popen:
    job = tmp / node / "job"
    job.mkdir(parents=True)
    key = tmp / f"{run}.key"   # the run's ring key, as the launch's GO would bring it
    if not key.exists():
        key.write_text(os.urandom(32).hex())
    argv = [*NODE, "supervise", "--job", str(job), "--state-dir",
            str(state_dir or tmp / "shared"), "--run", run, "--node", node, "--nodes", nodes,
            "--key-file", str(key),
            "--addresses", ",".join("127.0.0.1" for _ in nodes.split(",")),
            "--grace", "1", "--lease-timeout", str(lease_timeout),
            *(["--attached"] if attached else []), *(hang or []), "--",
            sys.executable, "-c", job_code, str(seconds), str(code)]
    return subprocess.Popen(argv, env={**os.environ, "CLUSTERTRAIN_RUN_ID": run},
                            start_new_session=True)


def wait_file(path: Path, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)
    return json.loads(path.read_text())


def group_alive(job: Path) -> bool:
    """Whether a process of the job's group still runs. A zombie is not one: it has ended,
    and its parent (or init, once it was re-parented) reaps it when it gets to it, which
    `killpg(pgid, 0)` does not wait for (the supervisor had exited with the group's last
    member not yet reaped, and this said "alive")."""
    pgid = int((job / "pgid").read_text())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue   # it ended while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def test_a_finished_job_is_recorded_on_the_share_and_on_the_node(tmp_path: Path) -> None:
    sup = start(tmp_path, "n0", seconds=0.5, code=3, nodes="n0")
    assert sup.wait(timeout=30) == 0
    exit_ = wait_file(tmp_path / "n0" / "job" / "exit")
    shared = json.loads((tmp_path / "shared" / "n0.json").read_text())
    assert exit_["code"] == shared["code"] == 3 and shared["reason"] == "exited"
    assert "job started" in (tmp_path / "n0" / "job" / "output.log").read_text()


def test_a_supervisor_asked_to_stop_before_it_started_never_starts_the_job(
        tmp_path: Path) -> None:
    """The launch failed on another node while this one's supervisor was starting: the
    stop request it finds keeps it from starting torchrun, and it ends as stopped."""
    job = tmp_path / "n0" / "job"
    job.mkdir(parents=True)
    (job / "stop-requested").write_text("1\n")
    argv = [*NODE, "supervise", "--job", str(job), "--state-dir",
            str(tmp_path / "shared"), "--run", "r1", "--node", "n0", "--nodes", "n0",
            "--", sys.executable, "-c", "open('started', 'w')"]
    assert subprocess.run(argv, cwd=tmp_path, timeout=30).returncode == 0
    assert wait_file(job / "exit")["reason"] == "stopped"
    assert not (tmp_path / "started").exists() and not (job / "pgid").exists()


def test_a_failed_peer_stops_this_node(tmp_path: Path) -> None:
    healthy = start(tmp_path, "n0")
    failing = start(tmp_path, "n1", seconds=2, code=1)
    try:
        assert failing.wait(timeout=30) == 0
        t0 = time.monotonic()
        state = wait_file(tmp_path / "n0" / "job" / "exit", timeout=20)
        assert (state["reason"], state["why"]) == ("peer-failed", "n1")
        assert time.monotonic() - t0 < 10
        assert not group_alive(tmp_path / "n0" / "job")
    finally:
        for p in (healthy, failing):
            p.kill()


def test_a_supervisor_in_a_slurm_step_stays_in_its_step_and_ends_on_sigterm(
        tmp_path: Path) -> None:
    """--in-step (srun started it as a step of the run's Slurm job): after GO it says
    STARTED with its own PID and goes on in the foreground (the step lasts as long as it
    does), its words in supervisor.log; SIGTERM, Slurm ending the step, ends the run here:
    torchrun's tree is stopped and the node's end says why."""
    job = tmp_path / "n0" / "job"
    job.mkdir(parents=True)
    argv = [*NODE, "supervise", "--wait-go", "--in-step", "--job", str(job), "--state-dir",
            str(tmp_path / "shared"), "--run", "r1", "--node", "n0", "--nodes", "n0",
            "--addresses", "127.0.0.1", "--grace", "1", "--",
            sys.executable, "-c", JOB, "300", "0"]
    sup = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           env={**os.environ, "CLUSTERTRAIN_RUN_ID": "r1"},
                           start_new_session=True)
    assert sup.stdin is not None and sup.stdout is not None
    try:
        assert sup.stdout.readline().decode().startswith(protocol.READY)
        sup.stdin.write(protocol.GoWord(os.urandom(protocol.RING_KEY_BYTES)).line().encode())
        sup.stdin.flush()
        assert sup.stdout.readline().decode().split() == [protocol.STARTED, str(sup.pid)]
        assert util.read_pid(str(job / "supervisor.pid")) == sup.pid
        deadline, log = time.monotonic() + 30, job / "output.log"
        while not (log.exists() and "job started" in log.read_text()):
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.1)
        assert sup.poll() is None, "the supervisor left its step"
        sup.terminate()   # SIGTERM, as slurmstepd sends it when the job is cancelled
        assert sup.wait(timeout=30) == 0
        end = json.loads((job / "exit").read_text())
        assert (end["reason"], end["why"]) == ("stopped", "its Slurm step was ended (SIGTERM)")
        assert not group_alive(job)
        assert (job / "supervisor.log").exists()
    finally:
        sup.kill()


# A rank's last words when gloo's collective timed out, as torchrun's output has them.
TIMED_OUT = ("import sys\nprint('RuntimeError: [../third_party/gloo/gloo/transport/tcp/"
             "pair.cc:534] Timed out waiting 10000ms for recv operation to complete', "
             "flush=True)\nsys.exit(1)\n")


@pytest.mark.parametrize("job_code, timed_out", [(TIMED_OUT, True), (JOB, False)])
def test_a_node_whose_collective_timed_out_says_so_in_its_end(
        tmp_path: Path, job_code: str, timed_out: bool) -> None:
    sup = start(tmp_path, "n0", seconds=0.2, code=1, nodes="n0", job_code=job_code)
    assert sup.wait(timeout=30) == 0
    state = json.loads((tmp_path / "shared" / "n0.json").read_text())
    assert (state["code"], state["reason"]) == (1, "exited")
    assert state.get("timed_out", False) is timed_out


def test_a_peers_collective_timeout_stops_a_detached_node_at_once(tmp_path: Path) -> None:
    """Detached, nobody else dumps the ranks still running: this node stops as for any
    failed peer."""
    healthy = start(tmp_path, "n0")
    failing = start(tmp_path, "n1", code=1, job_code=TIMED_OUT)
    try:
        assert failing.wait(timeout=30) == 0
        state = wait_file(tmp_path / "n0" / "job" / "exit", timeout=10)
        assert (state["reason"], state["why"]) == ("peer-failed", "n1")
    finally:
        for p in (healthy, failing):
            p.kill()


@pytest.mark.slow
def test_an_attached_node_leaves_a_peers_collective_timeout_to_the_controller(
        tmp_path: Path) -> None:
    """Attached, the controller dumps the ranks still running (one of them held the
    collective up) and then stops them: the node does not stop them first, or the rank
    to name is gone before it is dumped. A controller that does not act within
    TIMEOUT_DUMP_WAIT is not waited for longer."""
    waiting = start(tmp_path, "n0", attached=True, lease_timeout=120)
    failing = start(tmp_path, "n1", code=1, job_code=TIMED_OUT)
    job = tmp_path / "n0" / "job"
    try:
        assert failing.wait(timeout=30) == 0
        t0 = time.monotonic()
        time.sleep(5 * protocol.BEAT)
        assert not (job / "exit").exists() and group_alive(job)
        state = wait_file(job / "exit", timeout=protocol.TIMEOUT_DUMP_WAIT + 15)
        assert (state["reason"], state["why"]) == ("peer-failed", "n1")
        assert time.monotonic() - t0 > protocol.TIMEOUT_DUMP_WAIT - 5 * protocol.BEAT - 2
        assert not group_alive(job)
    finally:
        for p in (waiting, failing):
            p.kill()


def test_a_silent_peer_is_lost(tmp_path: Path, monkeypatch) -> None:
    """n1 stops beating (its node died): n0 stops after PEER_TIMEOUT."""
    n0 = start(tmp_path, "n0")
    n1 = start(tmp_path, "n1")
    try:
        wait_file(tmp_path / "shared" / "n1.json")
        os.killpg(n1.pid, 9)  # the supervisor and its whole session at once
        state = wait_file(tmp_path / "n0" / "job" / "exit", timeout=protocol.PEER_TIMEOUT + 15)
        assert (state["reason"], state["why"]) == ("peer-lost", "n1")
    finally:
        n0.kill()
        n1.kill()


def test_an_attached_run_stops_when_the_controller_leaves(tmp_path: Path) -> None:
    """The follower holds the lease on its stdin; end-of-input (the controller was killed)
    gives the lease up once no new follower renewed it for RECONNECT_GRACE, and the
    supervisor stops the job."""
    sup = start(tmp_path, "n0", attached=True, nodes="n0")
    job = tmp_path / "n0" / "job"
    try:
        wait_file(job / "pgid")
        follower = subprocess.Popen([*NODE, "follow", "--job", str(job),
                                     "--lease"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert follower.stdin is not None and follower.stdout is not None
        for _ in range(3):
            follower.stdin.write(b".")
            follower.stdin.flush()
            time.sleep(0.5)
        assert not (job / "exit").exists()
        follower.stdin.close()  # as when the controller dies
        t0 = time.monotonic()
        state = wait_file(job / "exit", timeout=protocol.RECONNECT_GRACE + 20)
        took = time.monotonic() - t0
        assert state["reason"] == "controller-lost", state
        assert protocol.RECONNECT_GRACE <= took < protocol.RECONNECT_GRACE + 5, took
        out = follower.stdout.read().decode()
        follower.wait(timeout=30)
        assert "job started" in out and f"{protocol.EXIT_MARKER} " in out
        assert not group_alive(job)
    finally:
        sup.kill()


def test_a_controller_that_connects_again_keeps_the_run(tmp_path: Path) -> None:
    """The controller's connection drops (its follower's input ends) and a new follower
    renews the lease within the grace: the job runs on, past the grace; the new follower
    streams from the line where the first broke off."""
    sup = start(tmp_path, "n0", attached=True, nodes="n0")
    job = tmp_path / "n0" / "job"
    argv = [*NODE, "follow", "--job", str(job), "--lease"]
    try:
        wait_file(job / "pgid")
        first = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert first.stdin is not None
        first.stdin.write(b".")
        first.stdin.flush()
        first.stdin.close()   # the connection dropped
        time.sleep(2)
        second = subprocess.Popen([*argv, "--from-line", "1"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
        assert second.stdin is not None and second.stdout is not None
        for _ in range(int(protocol.RECONNECT_GRACE) + 5):
            second.stdin.write(b".")
            second.stdin.flush()
            time.sleep(1)
        assert not (job / "exit").exists(), (job / "exit").read_text()
        second.stdin.close()
        state = wait_file(job / "exit", timeout=protocol.RECONNECT_GRACE + 20)
        assert state["reason"] == "controller-lost", state
        out = second.stdout.read().decode()
        second.wait(timeout=30)
        assert "job started" not in out and f"{protocol.EXIT_MARKER} " in out, out
        first.kill()
    finally:
        sup.kill()


def test_the_lease_after_end_of_input(tmp_path: Path) -> None:
    """Given up RECONNECT_GRACE after the follower's input ended, unless renewed since;
    silence beyond the timeout gives it up whatever."""
    lease, lost = tmp_path / protocol.LEASE_FILE, tmp_path / protocol.LEASE_LOST
    lease.touch()
    os.utime(lease, (1000, 1000))
    gone = lambda now: supervise._lease_gone(str(tmp_path), 30, now)  # noqa: E731
    assert not gone(1010) and gone(1031)          # no end of input: the timeout
    lost.touch()
    os.utime(lost, (1001, 1001))                  # input ended after the last renewal
    assert not gone(1001 + protocol.RECONNECT_GRACE - 1)
    assert gone(1001 + protocol.RECONNECT_GRACE + 1)
    os.utime(lease, (1002, 1002))                 # a new follower renewed it
    assert not gone(1001 + protocol.RECONNECT_GRACE + 1)
    assert gone(1033)


def test_a_silent_controller_loses_its_lease_after_the_timeout(tmp_path: Path) -> None:
    sup = start(tmp_path, "n0", attached=True, lease_timeout=3, nodes="n0")
    try:
        state = wait_file(tmp_path / "n0" / "job" / "exit", timeout=30)
        assert state["reason"] == "controller-lost"
    finally:
        sup.kill()


@pytest.mark.parametrize("start, expected", [([], ["a", "b", "c"]), (["--tail", "1"], ["c"]),
                                             (["--from-line", "1"], ["b", "c", "d"]),
                                             (["--from-line", "2"], ["c", "d"]),
                                             (["--from-line", "9"], ["d"])])
def test_follow_prints_the_log_then_the_exit_marker(tmp_path: Path, start, expected) -> None:
    """From the start, its last lines, or on from a line (a half-written last line comes
    whole)."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "output.log").write_text("a\nb\nc\n" + ("d" if "--from-line" in start else ""))
    util.write_json(str(job / "exit"), {"code": 0, "reason": "exited"})
    argv = [*NODE, "follow", "--job", str(job)]
    out = subprocess.run(argv + start, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    assert out.stdout.splitlines() == [*expected, f"{protocol.EXIT_MARKER} 0 exited -"]


def test_old_runs_are_pruned_but_never_a_live_one(tmp_path: Path) -> None:
    state = tmp_path / ".clustertrain"
    ids = [f"20260101-00000{i}-aaaaaa" for i in range(6)]
    for run_id in ids:
        for d in ("jobs", "code"):
            (state / d / run_id).mkdir(parents=True)
        (state / "jobs" / run_id / "exit").write_text("{}")
    # The oldest run is still running (no exit recorded, its process alive).
    (state / "jobs" / ids[0] / "exit").unlink()
    (state / "jobs" / ids[0] / "pgid").write_text(f"{os.getpid()}\n")
    (state / "code" / "latest").symlink_to(ids[5])
    removed = supervise.prune(str(state), keep=2, current=ids[5])
    assert removed == ids[1:4]
    assert sorted(p.name for p in (state / "jobs").iterdir()) == [ids[0], ids[4], ids[5]]
    assert sorted(p.name for p in (state / "code").iterdir()) == [ids[0], ids[4], ids[5],
                                                                  "latest"]


def test_a_stopped_peer_stops_this_node_too(tmp_path: Path) -> None:
    """The other nodes were stopped (this node had been cut off from the controller and
    declared lost): when it sees that, it ends its part as well."""
    (tmp_path / "shared").mkdir()
    util.write_json(str(tmp_path / "shared" / "n1.json"),
                          {"state": "ended", "reason": "stopped", "code": 143})
    sup = start(tmp_path, "n0")
    try:
        state = wait_file(tmp_path / "n0" / "job" / "exit", timeout=20)
        assert (state["reason"], state["why"]) == ("peer-stopped", "n1")
    finally:
        sup.kill()


def follow(job: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*NODE, "follow", "--job", str(job)],
                          capture_output=True, text=True, timeout=timeout)


def test_a_supervisor_that_fails_ends_its_node_with_a_reason(tmp_path: Path) -> None:
    """Its state directory cannot be made (a file is in the way): the node's part ends
    with an exit status that says so, and whoever follows it is told, not left waiting."""
    (tmp_path / "blocker").write_text("")
    sup = start(tmp_path, "n0", nodes="n0", state_dir=tmp_path / "blocker" / "shared")
    assert sup.wait(timeout=30) == 1
    job = tmp_path / "n0" / "job"
    state = wait_file(job / "exit", timeout=5)
    assert (state["code"], state["reason"]) == (1, "supervisor-failed")
    out = follow(job)
    assert out.returncode == 1
    assert "clustertrain supervisor on n0 failed: NotADirectoryError" in out.stdout
    assert out.stdout.splitlines()[-1].startswith(f"{protocol.EXIT_MARKER} 1 supervisor-failed")


def test_follow_ends_when_the_supervisor_is_gone_without_a_word(tmp_path: Path) -> None:
    """The supervisor was killed (OOM killer, kill -9) before it wrote an exit status: the
    follower says so with the last lines of its log instead of waiting forever."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "output.log").write_text("step 1\n")
    (job / "supervisor.log").write_text("Traceback (most recent call last):\nMemoryError\n")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (job / "supervisor.pid").write_text(f"{dead.pid}\n")
    out = follow(job)
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert lines[0] == "step 1"
    assert "clustertrain supervisor ended without an exit status: MemoryError" in lines
    assert lines[-1].startswith(f"{protocol.EXIT_MARKER} 1 supervisor-failed")


def test_follow_ends_only_once_the_supervisor_has_exited(tmp_path: Path) -> None:
    """The exit file comes before the supervisor's last writes (its state onto the share,
    the ring's last word): the marker waits for its exit, so a controller that returns on
    it leaves no process of the run behind."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "output.log").write_text("step 1\n")
    util.write_json(str(job / "exit"), {"code": 0, "reason": "exited"})
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    (job / "supervisor.pid").write_text(f"{late.pid}\n")
    reaped = threading.Thread(target=late.wait)   # as init reaps a detached supervisor
    reaped.start()
    out = follow(job)
    assert late.poll() is not None, "the marker came while the supervisor still ran"
    assert out.stdout.splitlines() == ["step 1", f"{protocol.EXIT_MARKER} 0 exited -"]
    reaped.join()


def test_a_peer_whose_supervisor_failed_stops_this_node(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    util.write_json(str(tmp_path / "shared" / "n1.json"),
                          {"state": "ended", "reason": "supervisor-failed", "code": 1})
    sup = start(tmp_path, "n0")
    try:
        state = wait_file(tmp_path / "n0" / "job" / "exit", timeout=20)
        assert (state["reason"], state["why"]) == ("peer-failed", "n1")
    finally:
        sup.kill()


def test_a_peer_stopped_for_another_peers_failure_names_that_failure() -> None:
    """n1 failed, then n0 was stopped for it: n2 knows both and names n1's failure, in
    whatever order the peers are listed."""
    ring = Ring("r1", "n2", ["n0", "n1", "n2"], ["127.0.0.1"] * 3, lambda name: None,
                Counters(), b"k" * 32)
    try:
        ring.status = {"n0": {"state": "ended", "reason": "stopped", "code": 143, "v": 1},
                       "n1": {"state": "ended", "reason": "exited", "code": 1, "v": 1}}
        assert supervise.Peers(ring).verdict() == (protocol.End.PEER_FAILED, "n1")
    finally:
        ring.close()


def test_supervision_costs_the_same_per_node_at_3_and_16_nodes(tmp_path: Path) -> None:
    """The run's supervision, counted by the supervisors themselves (their end's
    "supervision"): datagrams sent and received and share operations per node per second
    do not grow with the number of nodes (they did: each node read every peer's file)."""
    rates = {}
    sups = {n: [start(tmp_path / str(n), f"n{i}", seconds=15,
                      nodes=",".join(f"n{j}" for j in range(n))) for i in range(n)]
            for n in (3, 16)}   # both rings at once: 19 supervisors, a beat a second each
    for n in (3, 16):
        for sup in sups[n]:
            assert sup.wait(timeout=90) == 0
        ends = [wait_file(tmp_path / str(n) / f"n{i}" / "job" / "exit") for i in range(n)]
        assert {e["reason"] for e in ends} == {"exited"}, ends
        costs = [e["supervision"] for e in ends]
        # Each end says when it last heard its predecessor (a lost node's last sign).
        assert all(f"n{(i - 1) % n}" in e["heard"] for i, e in enumerate(ends)), ends
        per_s = {k: max(c[k] / c["seconds"] for c in costs)
                 for k in ("sent", "received", "share_reads", "share_writes")}
        rates[n] = per_s
        # One beat a second each way, plus a node's last words (a few datagrams, once).
        assert 0.5 < per_s["sent"] <= 2.0 and per_s["received"] <= 2.0, (n, per_s)
        assert per_s["share_reads"] + per_s["share_writes"] <= 1.0, (n, per_s)
    for key in ("sent", "received", "share_reads", "share_writes"):
        assert rates[16][key] <= rates[3][key] * 1.5 + 0.2, rates


@pytest.mark.parametrize("scope,says", [
    ("1", "kernel.yama.ptrace_scope is 1: a worker started without the worker runner"),
    ("2", "kernel.yama.ptrace_scope is 2 on this node: only root may read"),
    ("0", None),
])
def test_a_refused_py_spy_says_what_the_kernel_allows(tmp_path, monkeypatch, scope, says):
    yama = tmp_path / "ptrace_scope"
    yama.write_text(scope + "\n")
    monkeypatch.setattr(dump, "YAMA", str(yama))
    hint = dump.ptrace_hint("Error: Permission Denied: Try running again with "
                                  "elevated permissions")
    assert (says in hint) if says else hint == ""
    assert dump.ptrace_hint("Error: No such process") == ""


# A job that prints a line every 0.3 s for as long as it runs (progress).
CHATTY = ("import sys, time\n"
          "while True:\n    print('step', flush=True)\n    time.sleep(0.3)\n")


def test_a_detached_run_quiet_on_every_node_is_stopped_as_hung_with_its_dumps(
        tmp_path: Path) -> None:
    """--hang-timeout 3 on both nodes, jobs that print once and go quiet: both nodes dump
    their workers onto the share (STATE/hang/<node>.json) and end as hung."""
    hang = ["--hang-timeout", "3", "--on-hang", "stop"]
    sups = [start(tmp_path, n, hang=hang) for n in ("n0", "n1")]
    for n, sup in zip(("n0", "n1"), sups, strict=True):
        assert sup.wait(timeout=60) == 0
        end = wait_file(tmp_path / n / "job" / "exit")
        assert end["reason"] == "hung", end
        assert "no rank made progress for" in end["why"]
        dump = wait_file(tmp_path / "shared" / "hang" / f"{n}.json")
        assert dump["node"] == n and dump["quiet_s"] >= 3 and dump["ranks"] == []
        assert not group_alive(tmp_path / n / "job")


def test_a_node_that_makes_progress_keeps_the_run_from_being_hung(tmp_path: Path) -> None:
    """Hung means no progress anywhere: n0 is quiet, n1 prints; after twice the timeout
    neither has stopped and nothing was dumped. --on-hang wait on a quiet pair dumps and
    goes on."""
    hang = ["--hang-timeout", "4", "--on-hang", "stop"]
    quiet = start(tmp_path, "n0", hang=hang)
    chatty = start(tmp_path, "n1", hang=hang, job_code=CHATTY)
    try:
        time.sleep(10)
        assert quiet.poll() is None and chatty.poll() is None
        assert not (tmp_path / "shared" / "hang").exists()
    finally:
        for job in (tmp_path / "n0" / "job", tmp_path / "n1" / "job"):
            node_stop.stop_tree(str(job), "r1", 1.0)
        quiet.wait(timeout=30)
        chatty.wait(timeout=30)
    waiting = start(tmp_path / "w", "n0", nodes="n0", hang=["--hang-timeout", "2",
                                                           "--on-hang", "wait"])
    try:
        dump = wait_file(tmp_path / "w" / "shared" / "hang" / "n0.json", timeout=30)
        assert dump["quiet_s"] >= 2
        time.sleep(1.5)
        assert waiting.poll() is None  # kept: wait
    finally:
        node_stop.stop_tree(str(tmp_path / "w" / "n0" / "job"), "r1", 1.0)
        waiting.wait(timeout=30)


def test_no_node_stops_for_a_hang_before_every_node_has_dumped(tmp_path: Path) -> None:
    """The nodes see the hang a beat or two apart (here: n0 after 2 s, n1 only after 10 s).
    n0's word starts n1's dump, and n0 stops only once n1 has dumped: a stop before that
    would end n1's ranks (their collective breaks) before their stacks are taken."""
    first = start(tmp_path, "n0", hang=["--hang-timeout", "2", "--on-hang", "stop"])
    second = start(tmp_path, "n1", hang=["--hang-timeout", "10", "--on-hang", "stop"])
    for sup in (first, second):
        assert sup.wait(timeout=90) == 0
    n0_end = wait_file(tmp_path / "n0" / "job" / "exit")
    n1_dump = wait_file(tmp_path / "shared" / "hang" / "n1.json")
    assert n0_end["reason"] == "hung"
    assert n1_dump["detected_at"] < n0_end["ended"], "n0 stopped before n1 had dumped"
    assert n1_dump["quiet_s"] < 10  # n1 dumped on n0's word, before its own timeout


def slurm_doubles(tmp: Path, squeue_says: str) -> dict[str, str]:
    """squeue and scancel as test doubles (there is no Slurm here; the real path is
    tests/orchestrator/run/test_queue_sandbox.py): squeue prints SQUEUE_SAYS until scancel
    has said anything to the job (then nothing: the job ended), scancel writes its arguments
    to tmp/scancel.log. The environment a --queue run's supervisor gets."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    log = tmp / "scancel.log"
    for name, body in (("squeue", f"[ -e {log} ] || echo {squeue_says}\n"),
                       ("scancel", f'echo "$@" >> {tmp / "scancel.log"}\n')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}")
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CLUSTERTRAIN_SLURM_JOB": "77"}


def run_processes(run: str) -> list[int]:
    """The live processes (not zombies) that carry RUN's id in their environment, as the
    stop finds a run's (node/terminate.py belongs)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if f"{protocol.RUN_ID_ENV}={run}".encode() in (proc / "environ").read_bytes().split(
                    b"\0") and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(proc.name))
        except (OSError, IndexError):
            continue   # it ended while we looked, or is not ours to read
    return found


def test_no_process_of_a_stopped_run_outlives_its_recorded_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's Slurm job ended: the node stops the run's tree, and only then records its
    end and exits. The job's leader ends at once on the group's SIGTERM; its child, in a
    session of its own as torchrun's workers are, hears nothing of it and is killed after
    the grace: the supervisor did not exit before that (its stop ran on a thread that its
    exit cut short, and the child lived on with the run recorded as ended)."""
    says = tmp_path / "squeue-says"
    says.write_text("RUNNING\n")
    for key, value in slurm_doubles(tmp_path, f"$(cat {says})").items():
        monkeypatch.setenv(key, value)
    run = f"r{os.getpid()}-left"
    sup = start(tmp_path, "n0", nodes="n0", run=run)
    try:
        output = tmp_path / "n0" / "job" / "output.log"
        deadline = time.monotonic() + 30
        while not (output.exists() and "job started" in output.read_text()):
            assert time.monotonic() < deadline and sup.poll() is None, "the job never started"
            time.sleep(0.1)
        says.write_text("CANCELLED\n")   # the job's child runs: Slurm ends the job now
        assert sup.wait(timeout=60) == 0
        assert wait_file(tmp_path / "n0" / "job" / "exit")["reason"] == "stopped"
        assert run_processes(run) == []
    finally:
        sup.kill()
        for pid in run_processes(run):
            os.kill(pid, 9)


def test_a_run_whose_slurm_job_ended_stops_and_says_why(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """scancel of the run's job (or its time limit): the node stops its ranks, its state
    says why, and the job is cancelled once the node's part (the only one) has ended."""
    for key, value in slurm_doubles(tmp_path, "CANCELLED").items():
        monkeypatch.setenv(key, value)
    sup = start(tmp_path, "n0", nodes="n0")
    try:
        state = wait_file(tmp_path / "n0" / "job" / "exit", timeout=30)
        assert (state["reason"], state["why"]) == (
            "stopped", "its Slurm job 77 ended (scancel, or its time limit)")
        assert sup.wait(timeout=30) == 0
        assert not group_alive(tmp_path / "n0" / "job")
        assert (tmp_path / "scancel.log").read_text() == "77\n"
    finally:
        sup.kill()


def test_a_queued_run_whose_train_was_killed_is_controller_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 of an attached --queue run's train: its connection closes, so its followers'
    input ends and its Slurm job is cancelled (allocate's end). The job's end is then no
    cause but an effect: the run's record says its controller went away, as a run without
    --queue says it, not that Slurm ended its job."""
    says = tmp_path / "squeue-says"
    says.write_text("RUNNING\n")
    for key, value in slurm_doubles(tmp_path, f"$(cat {says})").items():
        monkeypatch.setenv(key, value)
    sup = start(tmp_path, "n0", attached=True, nodes="n0", lease_timeout=120)
    job = tmp_path / "n0" / "job"
    try:
        wait_file(job / "pgid")
        follower = subprocess.Popen([*NODE, "follow", "--job", str(job), "--lease"],
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        assert follower.stdin is not None
        follower.stdin.write(b".")
        follower.stdin.flush()
        time.sleep(1)
        follower.stdin.close()   # train killed: its connection, and the follower's input, end
        says.write_text("CANCELLED\n")   # and allocate cancelled the job
        state = wait_file(job / "exit", timeout=slurmjob.LOOK + 10)
        follower.wait(timeout=30)
        assert (state["reason"], state["why"]) == (
            "controller-lost", "its train went away, and its Slurm job 77 with it"), state
    finally:
        sup.kill()


def test_a_run_that_ends_gives_its_slurm_job_back(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in slurm_doubles(tmp_path, "RUNNING").items():
        monkeypatch.setenv(key, value)
    sup = start(tmp_path, "n0", nodes="n0", seconds=1)
    assert sup.wait(timeout=30) == 0
    state = wait_file(tmp_path / "n0" / "job" / "exit", timeout=5)
    assert (state["reason"], state["code"]) == ("exited", 0)
    # it succeeded: its job is told so (COMPLETED in sacct), not cancelled
    assert (tmp_path / "scancel.log").read_text() == "--batch --signal=USR1 77\n"


def test_a_supervisor_that_fails_gives_its_slurm_job_back(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in slurm_doubles(tmp_path, "RUNNING").items():
        monkeypatch.setenv(key, value)
    (tmp_path / "blocker").write_text("")
    sup = start(tmp_path, "n0", nodes="n0", state_dir=tmp_path / "blocker" / "shared")
    assert sup.wait(timeout=30) == 1
    assert wait_file(tmp_path / "n0" / "job" / "exit", timeout=5)["reason"] == "supervisor-failed"
    assert (tmp_path / "scancel.log").read_text() == "--batch --signal=USR2 77\n"   # FAILED
