"""Following a run to its end (run/job.py's Job), for real on this machine: two nodes
launched as in test_launch.py (the real supervisors, a stand-in for torchrun), their
logs followed through the node package's `follow`, stops through its `stop`."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from orchestrator.node.protocol import EXIT_MARKER, STOP_MARKER, SYSTEM_MARKER, End
from orchestrator.node.steptime import beat_line
from orchestrator.record.rundir import RunDir
from orchestrator.record.system import Sample
from orchestrator.report.page import read_timeline
from orchestrator.run.conclude import JobResult, NodeOutcome
from orchestrator.run.job import Following, Job, whole_log
from orchestrator.run.launch import Launch
from orchestrator.run.scheduler import SshScheduler

from ..node.test_sysmetrics import SMI_BIN
from .test_launch import nodes

# torchrun's stand-in: each node says a word; node rank FAILS fails with 3 a second
# later, the others live on until stopped.
TORCHRUN = ("#!{python}\n"
            "import os, signal, sys, time\n"
            "rank = os.environ['CLUSTERTRAIN_NODE_RANK']\n"
            "def stopped(signum, frame):   # as torchrun says it: a traceback\n"
            "    print('Traceback (most recent call last):', flush=True)\n"
            "    print(f'SignalException: Process {{os.getpid()}} got signal: {{signum}}',\n"
            "          flush=True)\n"
            "    sys.exit(1)\n"
            "signal.signal(signal.SIGTERM, stopped)\n"
            "print(f'node {{rank}} training', flush=True)\n"
            "if rank == '{fails}':\n"
            "    time.sleep(1)\n"
            "    sys.exit(3)\n"
            "time.sleep(120)\n")


def launched(tmp: Path, torchrun: str, count: int = 2, **changes) -> tuple[Job, io.StringIO]:
    """A Job over COUNT local nodes whose torchrun is the script TORCHRUN, launched (its
    node commands with CHANGES), and the StringIO its terminal writes to."""
    pairs, clients = nodes(tmp, count=count)
    (tmp / "torchrun").write_text(torchrun)
    pairs = [(spec, replace(cmd, addresses=("127.0.0.1",) * len(pairs), **changes))
             for spec, cmd in pairs]
    launch = Launch.start(pairs, clients)
    try:
        assert launch.go(b"k" * 32, {}) == {}
    except BaseException:
        launch.cancel()
        raise
    run = RunDir(tmp / "runs", "r1")
    run.path.mkdir(parents=True)
    out = io.StringIO()
    return Job(run, pairs, SshScheduler(clients), out=out,
               **({"grace": changes["grace"]} if "grace" in changes else {})), out


def follow(tmp: Path, attached: bool, fails: int | None = 1,
           interrupt: signal.Signals | None = None) -> tuple[JobResult, str, RunDir]:
    job, out = launched(tmp, TORCHRUN.format(python=sys.executable, fails=fails), grace=2.0)
    run = job.rundir
    if interrupt is not None:   # as a user's kill would, once both nodes are training
        threading.Thread(target=signal_when_training, args=(run, interrupt),
                         daemon=True).start()
    return job.run(attached=attached), out.getvalue(), run


def signal_when_training(run: RunDir, signum: signal.Signals) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all(path.is_file() and "training" in path.read_text()
               for path in (run.log("n0"), run.log("n1"))):
            os.kill(os.getpid(), signum)
            return
        time.sleep(0.1)


def test_the_first_failure_is_named_and_the_other_node_ends_for_it(tmp_path: Path) -> None:
    result, said, run = follow(tmp_path, attached=False)
    assert result.first_failed == "n1" and not result.interrupted, said
    assert (result.outcomes["n1"].exit_code, result.outcomes["n1"].reason) == (3, End.EXITED)
    # n0's supervisor heard of n1's failure over the ring and stopped its torchrun.
    assert (result.outcomes["n0"].reason, result.outcomes["n0"].why) == \
        (End.PEER_FAILED, "n1"), said
    assert "n1: torchrun exited with code 3" in said
    assert "node 0 training" in said and "node 1 training" in said
    assert "node 1 training" in run.log("n1").read_text()


def test_sigterm_stops_the_job_on_every_node(tmp_path: Path) -> None:
    result, said, run = follow(tmp_path, attached=True, fails=None,
                               interrupt=signal.SIGTERM)
    assert result.interrupted and result.why_interrupted == "SIGTERM", said
    assert "interrupted (SIGTERM): stopping the job on every node" in said
    assert result.first_failed is None, said
    assert all(o.reason.caused_elsewhere for o in result.outcomes.values()), result.outcomes
    # torchrun's traceback at the stop is in each node's log, not on the terminal.
    assert "Traceback" not in said and "SignalException" not in said, said
    for name in ("n0", "n1"):
        log = run.log(name).read_text()
        assert f"{name}/torchrun | SignalException: Process" in log, log
        assert "@@clustertrain" not in log, log


def test_a_failing_node_still_shows_its_cause(tmp_path: Path) -> None:
    """n1's torchrun fails by itself: what it says is shown; n0, stopped for it, says
    its traceback into its log only."""
    result, said, run = follow(tmp_path, attached=True, fails=1)
    assert result.first_failed == "n1", said
    assert "n1/torchrun | node 1 training" in said
    assert "SignalException" not in said, said
    assert "SignalException" in run.log("n0").read_text()


def test_a_rank_that_prints_the_stop_mark_hides_nothing(tmp_path: Path) -> None:
    """The mark counts where the node's stop writes it (torchrun's own lines), not in a
    rank's output: a script printing it is shown, and so is what torchrun says after."""
    run = RunDir(tmp_path / "runs", "r1")
    run.path.mkdir(parents=True)
    out = io.StringIO()
    job = Job(run, [], SshScheduler({}), out=out)
    lines = ["n0/rank0 | @@clustertrain-stopping", "n0/torchrun | Traceback (most recent "
             "call last):"]
    with open(run.log("n0"), "a") as log:
        job._emit(log, NodeOutcome("n0"), lines)
    assert out.getvalue().splitlines() == lines


def test_a_nodes_system_samples_go_to_the_timeline_and_a_flag_is_said_once(
        tmp_path: Path) -> None:
    """The supervisor's sample lines are neither shown nor kept in the run's log: they
    go to its timeline; a node close to running out of memory is said once."""
    run = RunDir(tmp_path / "runs", "r1")
    run.path.mkdir(parents=True)
    out = io.StringIO()
    job = Job(run, [], SshScheduler({}), out=out)
    gib = 1 << 30

    def sample(t: float, available: int) -> str:
        return (f'n0/torchrun | @@clustertrain-system {{"t":{t},"cpu_pct":12.5,'
                f'"mem_total":{64 * gib},"mem_available":{available},"job_rss":{60 * gib}}}')

    lines = ["n0/rank0 | epoch 1", sample(100.0, 2 * gib), sample(110.0, gib),
             "n0/torchrun | done"]
    with open(run.log("n0"), "a") as log:
        job._emit(log, NodeOutcome("n0"), job._take_system("n0", lines))
    job._keep_timeline()
    flag = ("[clustertrain] n0 is close to running out of memory: 2.0 GiB of 64.0 GiB "
            "available, the job's processes hold 60.0 GiB")
    assert out.getvalue().splitlines() == [flag, "n0/rank0 | epoch 1", "n0/torchrun | done"]
    assert "@@clustertrain" not in run.log("n0").read_text()
    samples = run.read_timeline(Sample.from_json)
    assert [(s.node, s.t, s.mem_available) for s in samples] == [("n0", 100.0, 2 * gib),
                                                                 ("n0", 110.0, gib)]
    assert read_timeline(run) == []
    assert job._result(Following(False, set(), 0.0), 0.0).system_flags == [
        {"node": "n0", "kind": "memory", "t": 100.0, "message": flag[len("[clustertrain] "):]}]
    # `attach` again: the node's log from its start; only the newer sample is added.
    again = Job(run, [], SshScheduler({}), out=io.StringIO())
    again._take_system("n0", [*lines, sample(120.0, 3 * gib)])
    again._keep_timeline()
    assert [s.t for s in run.read_timeline(Sample.from_json)] == [100.0, 110.0, 120.0]


def test_a_straggler_that_the_last_windows_name_is_said_at_the_end(tmp_path: Path) -> None:
    """A node found slower only once the run's last windows close (a loaded machine made
    the run end before a live look could judge enough windows): the end says it on the
    terminal too, once, as the summary names it."""
    run = RunDir(tmp_path / "runs", "r1")
    run.path.mkdir(parents=True)
    out = io.StringIO()
    job = Job(run, [], SshScheduler({}), out=out)
    begun = time.monotonic()
    for second in range(65):   # a beat a second from each rank, after any live look
        for node, step_s in (("n0", 0.10), ("n1", 0.10), ("n2", 0.15)):
            job.progress.line(node, 0, f"##clustertrain beat step_s={step_s}",
                              now=begun + 1000 + second)
    job._look_at_progress()
    assert out.getvalue() == ""   # no window closed yet
    result = job._result(Following(False, set(), 0.0), 0.0)
    said = out.getvalue().splitlines()
    assert len(said) == 1 and said[0].startswith(
        "[clustertrain] n2 is 50 % slower than the median step time"), said
    assert [s["node"] for s in result.progress["stragglers"]] == ["n2"]
    job._look_at_progress()
    assert len(out.getvalue().splitlines()) == 1   # said once


# A quiet job: one line, then nothing for 12 s (one system sample comes meanwhile).
QUIET = ("#!{python}\n"
         "import time\n"
         "print('[rank0]:started', flush=True)\n"
         "time.sleep(12)\n")


def test_the_supervisor_samples_its_node_while_the_job_prints_nothing(tmp_path: Path) -> None:
    """The real supervisor: its samples reach the timeline (GPUs from nvidia-smi's test
    double on the job's PATH), not the terminal, and the quiet job stays quiet."""
    job, out = launched(tmp_path, QUIET.format(python=sys.executable), count=1,
                        env={"PATH": f"{SMI_BIN}:{os.environ['PATH']}"})
    run = job.rundir
    result = job.run(attached=True)
    said = out.getvalue()
    assert result.ok, said
    assert said.splitlines() == ["n0/rank0 | started"]
    assert job.progress.quiet_for(time.monotonic()) > 9   # the samples were not progress
    (sample, *_) = run.read_timeline(Sample.from_json)
    assert sample.node == "n0" and sample.cpu_pct is not None and sample.job_rss
    assert [g.util_pct for g in sample.gpus] == [0.0, 0.0]
    assert sample.rx_bps is not None    # loopback: the address the run gave the node


def test_a_nodes_whole_log_is_kept_as_following_it_keeps_it() -> None:
    """What settling a run nobody followed writes for a node (run/settle.py fetch_logs):
    its words, prefixed, a rank's line cut by torchrun's tailer whole again; not the
    session's markers, the node's samples, the ranks' beats or the node's stop echo."""
    output = (f"[rank1]:epoch 1 loss 0.5\n[rank1]:{beat_line(0.1, None, None, 3, 'node')}\n"
              f"[rank1]:sum [rank1]:12\ntorchrun says\n{STOP_MARKER} SIGTERM\n"
              f"{SYSTEM_MARKER} {{}}\n{EXIT_MARKER} 0 exited -\n").encode()
    assert whole_log("node1", output) == ["node1/rank1 | epoch 1 loss 0.5",
                                          "node1/rank1 | sum 12", "node1/torchrun | torchrun says"]


def test_a_pipe_whose_reader_left_is_seen_without_a_write(tmp_path) -> None:
    """`train | head` with a quiet job: head has its lines and leaves; train must find
    out without a line to write (a clean clone's run of the sandbox test hung 300 s)."""
    import os
    import threading
    import time

    from orchestrator.run.job import reader_gone

    read_end, write_end = os.pipe()
    out = os.fdopen(write_end, "w")
    out.write("every line head wanted\n")
    out.flush()
    threading.Timer(0.3, os.close, args=(read_end,)).start()
    started = time.monotonic()
    assert reader_gone(out, threading.Event(), look=0.1) is True
    assert time.monotonic() - started < 3
    out.close()
    # a file is no pipe (nobody leaves it), and a job that ended stops the look
    with open(tmp_path / "log", "w") as log:
        assert reader_gone(log, threading.Event()) is False
    r2, w2 = os.pipe()
    done = threading.Event()
    done.set()
    with os.fdopen(w2, "w") as piped:
        assert reader_gone(piped, done) is False
    os.close(r2)
