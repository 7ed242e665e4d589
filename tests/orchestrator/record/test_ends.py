"""How each rank ended, from the nodes' logs (orchestrator/record/ends.py), and how `train`
records and reports a rank that died after its script had finished."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import LaunchError
from orchestrator.node.protocol import End
from orchestrator.record.ends import NodeEnds, scan_log
from orchestrator.record.rundir import RunDir
from orchestrator.record.status import NodeEnd, judge
from orchestrator.record.summary import Summary
from orchestrator.run.command import NodeCommand
from orchestrator.run.conclude import JobResult, NodeOutcome, conclude as _conclude, make_summary

# What torchrun 2.13 printed (node log, prefixed by logstream) when rank 1 aborted after
# the runner's marker: the report's format is torch's (multiprocessing/errors).
ABORT_AFTER_FINISH = """\
node1/rank1 | rank 1/3 host node1 sum 6 ok
node1/rank1 | [clustertrain] rank 1 finished: exit code 0
node1/rank1 | terminate called without an active exception
node1/torchrun | E1122 12:16:36.528000 16764 api.py:1002] failed (exitcode: -6) local_rank: 0
node1/torchrun | torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
node1/torchrun | ======================================================
node1/torchrun | .clustertrain/run_worker.py FAILED
node1/torchrun | ------------------------------------------------------
node1/torchrun | Failures:
node1/torchrun |   <NO_OTHER_FAILURES>
node1/torchrun | ------------------------------------------------------
node1/torchrun | Root Cause (first observed failure):
node1/torchrun | [0]:
node1/torchrun |   time      : 2026-11-22_12:16:36
node1/torchrun |   host      : node1
node1/torchrun |   rank      : 1 (local_rank: 0)
node1/torchrun |   exitcode  : -6 (pid: 16790)  (SIGABRT)
node1/torchrun |   error_file: <N/A>
node1/torchrun |   traceback : Signal 6 (SIGABRT) received by PID 16790
node1/torchrun | ======================================================
"""


def test_the_marker_and_torchruns_report_are_read() -> None:
    ends = scan_log(ABORT_AFTER_FINISH.splitlines())
    assert ends == NodeEnds(finished={1: 0}, failed={1: -6})
    # Unprefixed lines (torchrun's own log file) read the same.
    raw = [line.split(" | ", 1)[1] for line in ABORT_AFTER_FINISH.splitlines()]
    assert scan_log(raw) == ends


def test_a_script_cannot_fake_torchruns_report_and_a_restart_starts_over() -> None:
    lines = ["node0/rank0 | Root Cause", "node0/rank0 |   rank      : 0",
             "node0/rank0 |   exitcode  : -6",
             "node0/rank0 | [clustertrain] rank 0 finished: exit code 0",
             "node0/torchrun | [default] Worker group FAILED. 2/3 attempts left; will "
             "restart worker group",
             "node0/rank0 | [clustertrain] rank 0 finished: exit code 3"]
    assert scan_log(lines) == NodeEnds(finished={0: 3}, failed={})


def ends_of(text: str) -> NodeEnds:
    return scan_log(text.splitlines())


def test_a_rank_that_finished_then_aborted_is_named_and_the_training_completed() -> None:
    nodes = [NodeEnd("node0", 1, 0, End.EXITED), NodeEnd("node1", 1, 1, End.EXITED),
             NodeEnd("node2", 1, 0, End.EXITED)]
    ends = {"node0": ends_of("node0/rank0 | [clustertrain] rank 0 finished: exit code 0"),
            "node1": ends_of(ABORT_AFTER_FINISH),
            "node2": ends_of("node2/rank2 | [clustertrain] rank 2 finished: exit code 0")}
    verdict = judge(nodes, ends, clean_exit=True)
    assert verdict.training_completed is True
    assert verdict.after_finish == {
        "node1": ["rank 1 on node1 finished, then aborted in torch's teardown"]}
    # Without rank 2's marker the training did not complete; node1's note stays.
    del ends["node2"]
    verdict = judge(nodes, ends, clean_exit=True)
    assert verdict.training_completed is False and "node1" in verdict.after_finish


def test_a_real_failure_is_not_called_a_teardown_abort() -> None:
    nodes = [NodeEnd("node0", 1, 0, End.EXITED), NodeEnd("node1", 1, 3, End.EXITED)]
    # sys.exit(3): the marker says 3 and torchrun reports 3.
    exit3 = ABORT_AFTER_FINISH.replace("exit code 0", "exit code 3").replace(
        "exitcode  : -6", "exitcode  : 3")
    ends = {"node0": ends_of("node0/rank0 | [clustertrain] rank 0 finished: exit code 0"),
            "node1": ends_of(exit3)}
    verdict = judge(nodes, ends, clean_exit=True)
    assert verdict.training_completed is False and verdict.after_finish == {}
    # A crash without a marker (the script never finished).
    ends["node1"] = ends_of(ABORT_AFTER_FINISH.replace(
        "node1/rank1 | [clustertrain] rank 1 finished: exit code 0\n", ""))
    verdict = judge(nodes, ends, clean_exit=True)
    assert verdict.training_completed is False and verdict.after_finish == {}
    # Without the runner there are no markers: not known.
    assert judge(nodes, {}, clean_exit=False).training_completed is None


def test_other_deaths_after_the_marker_and_a_stopped_node() -> None:
    segv = ABORT_AFTER_FINISH.replace("exitcode  : -6", "exitcode  : -11")
    verdict = judge([NodeEnd("node1", 1, 1, End.EXITED)], {"node1": ends_of(segv)}, True)
    assert verdict.after_finish["node1"] == [
        "rank 1 on node1 finished, then died of SIGSEGV in torch's teardown"]
    stopped = ends_of("node0/rank0 | [clustertrain] rank 0 finished: exit code 0")
    verdict = judge([NodeEnd("node0", 1, 143, End.PEER_FAILED)], {"node0": stopped}, True)
    assert verdict.after_finish["node0"] == [
        "every rank on node0 had finished when the node was stopped"]


# -- train's record and report ------------------------------------------------------------

def command(i: int) -> NodeCommand:
    return NodeCommand(run_id="r1", node_rank=i, nnodes=3, nproc=1, master_addr="node0",
                       master_port=29500, torchrun="torchrun", home="/home/alice",
                       script="job.py", node=f"node{i}", nodes=("node0", "node1", "node2"),
                       run_state=str(Path("/srv/shared/runs/alice/r1")))


def record(tmp_path: Path, logs: dict[str, str], codes: dict[str, int], first_failed):
    run = RunDir(tmp_path, "r1")
    run.path.mkdir()
    for node, text in logs.items():
        run.log(node).write_text(text)
    outcomes = {n: NodeOutcome(n, exit_code=c, reason=End.EXITED) for n, c in codes.items()}
    outcomes["node1"].last_lines.extend(ABORT_AFTER_FINISH.splitlines())
    result = JobResult(outcomes, first_failed, False, 0.0, 1.0)
    names = list(codes)
    commands = [command(i) for i in range(len(names))]
    return run, result, make_summary({"run_id": "r1"}, commands, names, result, 0.0,
                                     run).to_json()


def test_a_finished_run_is_reported_finished_despite_a_teardown_abort(tmp_path, capsys):
    logs = {"node0": "node0/rank0 | [clustertrain] rank 0 finished: exit code 0\n",
            "node1": ABORT_AFTER_FINISH,
            "node2": "node2/rank2 | [clustertrain] rank 2 finished: exit code 0\n"}
    run, result, summary = record(tmp_path, logs, {"node0": 0, "node1": 1, "node2": 0},
                                  "node1")
    assert summary["status"] == "succeeded" and summary["training_completed"] is True
    assert summary["first_failed"] is None          # the node is not blamed
    assert summary["exit_codes"]["node1"] == 1      # what torchrun said stays on record
    assert summary["after_finish"] == {
        "node1": ["rank 1 on node1 finished, then aborted in torch's teardown"]}
    assert json.loads(json.dumps(summary)) == summary
    assert _conclude(run, result, Summary.from_json(summary)) == 0
    err = capsys.readouterr().err
    assert ("the training completed on every rank; rank 1 on node1 finished, then aborted "
            "in torch's teardown") in err


def test_a_run_whose_ranks_did_not_all_finish_still_fails(tmp_path):
    logs = {"node0": "node0/rank0 | still training\n", "node1": ABORT_AFTER_FINISH,
            "node2": "node2/rank2 | [clustertrain] rank 2 finished: exit code 0\n"}
    run, result, summary = record(tmp_path, logs, {"node0": 143, "node1": 1, "node2": 0},
                                  "node1")
    assert summary["status"] == "failed" and summary["training_completed"] is False
    assert summary["first_failed"] == "node1"
    with pytest.raises(LaunchError) as err:
        _conclude(run, result, Summary.from_json(summary))
    assert ("node1 exited with code 1 after its ranks finished (rank 1 on node1 finished, "
            "then aborted in torch's teardown), but not every rank of the run had finished its "
            "script") in str(err.value)


def test_a_succeeded_run_says_its_training_completed(tmp_path):
    logs = {f"node{i}": f"node{i}/rank{i} | [clustertrain] rank {i} finished: exit code 0\n"
            for i in range(3)}
    _, _, summary = record(tmp_path, logs, {"node0": 0, "node1": 0, "node2": 0}, None)
    assert summary["status"] == "succeeded" and summary["training_completed"] is True
    assert "after_finish" not in summary


def test_a_scripts_own_exit_code_is_reported(tmp_path):
    exit3 = ABORT_AFTER_FINISH.replace("exit code 0", "exit code 3").replace(
        "exitcode  : -6", "exitcode  : 3")
    logs = {"node0": "node0/rank0 | waiting\n", "node1": exit3,
            "node2": "node2/rank2 | waiting\n"}
    run, result, summary = record(tmp_path, logs, {"node0": 143, "node1": 1, "node2": 143},
                                  "node1")
    assert summary["status"] == "failed" and summary["rank_exit_codes"] == {"node1": {"1": 3}}
    with pytest.raises(LaunchError, match=r"failed: node1 exited with code 1 \(rank 1 exited "
                                          r"with code 3\) first"):
        _conclude(run, result, Summary.from_json(summary))


def test_a_node_whose_disk_was_full_says_where_in_the_error_and_the_record(tmp_path):
    """The supervisor's note (node/space.py) on a rank that died of a full disk."""
    full = ("node1/rank1 | OSError: [Errno 28] No space left on device\n"
            "node1/rank1 | [clustertrain] rank 1 finished: exit code 1\n"
            "node1/torchrun | [clustertrain] out of space: /tmp (temporary files) has "
            "12 KiB free of 64 MiB\n")
    assert ends_of(full).no_space == "/tmp (temporary files) has 12 KiB free of 64 MiB"
    logs = {"node0": "node0/rank0 | waiting\n", "node1": full}
    run, result, summary = record(tmp_path, logs, {"node0": 143, "node1": 1}, "node1")
    assert summary["no_space"] == {"node1": "/tmp (temporary files) has 12 KiB free of 64 MiB"}
    with pytest.raises(LaunchError, match=r"stopped\. It ran out of space \(its ranks said a "
                       r"disk was full\): on node1, /tmp \(temporary files\) has 12 KiB free "
                       r"of 64 MiB; free some there, or write elsewhere\."):
        _conclude(run, result, Summary.from_json(summary))
    # A rank cannot make the note: only the supervisor's line (torchrun's stream) counts.
    assert ends_of("node1/rank1 | [clustertrain] out of space: /x has 0 KiB\n").no_space is None


# -- which node a failed run is named after ------------------------------------------------

# node1's worker killed (SIGKILL): node0's rank fails at once in gloo, and node0 ends before
# node1's torchrun has reported its dead worker (what a clean-clone CI run showed). The
# gloo line is torch 2.13's.
PEER_RESET = """\
node0/rank0 | epoch 1 step 20 loss 2.01
node0/rank0 | [rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/\
tcp/pair.cc:537] Read error [10.89.1.11]:26855: Connection reset by peer. This is typically \
caused by a remote worker hanging or bugs in the application.
node0/rank0 | [clustertrain] rank 0 finished: exit code 1
node0/torchrun | Root Cause (first observed failure):
node0/torchrun | [0]:
node0/torchrun |   rank      : 0 (local_rank: 0)
node0/torchrun |   exitcode  : 1 (pid: 3821)
node0/torchrun | ============================================================
"""
KILLED = """\
node1/rank1 | epoch 1 step 20 loss 2.03
node1/torchrun | Root Cause (first observed failure):
node1/torchrun | [0]:
node1/torchrun |   rank      : 1 (local_rank: 0)
node1/torchrun |   exitcode  : -9 (pid: 4242)
node1/torchrun | ============================================================
"""


def failed_run(tmp_path: Path, logs: dict[str, str], ends: dict[str, tuple[int | None, str, float]],
               first_failed: str):
    """A run whose nodes ended as ENDS says (node -> torchrun's code, reason, when)."""
    run = RunDir(tmp_path, "r1")
    run.path.mkdir()
    for node, text in logs.items():
        run.log(node).write_text(text)
    outcomes = {n: NodeOutcome(n, exit_code=c, reason=End(r), ended=t)
                for n, (c, r, t) in ends.items()}
    for node, text in logs.items():
        outcomes[node].last_worker_lines.extend(
            line for line in text.splitlines() if "/rank" in line.split(" | ")[0])
    result = JobResult(outcomes, first_failed, False, 0.0, 3.0)
    commands = [command(i) for i in range(len(ends))]
    return run, result, make_summary({"run_id": "r1"}, commands, list(ends), result, 0.0,
                                     run).to_json()


def test_the_node_whose_worker_died_is_named_not_the_peer_that_failed_first(tmp_path):
    logs = {"node0": PEER_RESET, "node1": KILLED, "node2": "node2/rank2 | epoch 1\n"}
    run, result, summary = failed_run(
        tmp_path, logs, {"node0": (1, "exited", 1.0), "node1": (1, "stopped", 1.5),
                         "node2": (143, "stopped", 1.6)}, first_failed="node0")
    assert summary["first_failed"] == "node1"
    assert {n["name"]: (n["end_reason"], n.get("why")) for n in summary["nodes"]} == {
        "node0": ("peer-failed", "node1"), "node1": ("stopped", None),
        "node2": ("stopped", None)}
    with pytest.raises(LaunchError) as err:
        _conclude(run, result, Summary.from_json(summary))
    assert ("failed: node1 exited with code 1 (rank 1 died of SIGKILL); node0 ended before "
            "it only because its ranks lost their peers on node1 first") in str(err.value)
    assert "node1/rank1 | epoch 1 step 20 loss 2.03" in str(err.value)


def test_a_peer_error_with_no_other_cause_names_the_node_that_saw_it(tmp_path):
    """Nobody else failed by itself (a cable, a switch): the node that saw its peers go is
    the only evidence there is, and the run is named after it."""
    logs = {"node0": PEER_RESET, "node1": "node1/rank1 | epoch 1\n",
            "node2": "node2/rank2 | epoch 1\n"}
    _, _, summary = failed_run(
        tmp_path, logs, {"node0": (1, "exited", 1.0), "node1": (143, "stopped", 1.5),
                         "node2": (143, "stopped", 1.6)}, first_failed="node0")
    assert summary["first_failed"] == "node0"
    assert summary["nodes"][0]["end_reason"] == "exited"


def test_a_lost_node_is_named_over_a_peer_that_failed_first(tmp_path):
    logs = {"node0": PEER_RESET, "node1": "node1/rank1 | epoch 1\n"}
    _, _, summary = failed_run(
        tmp_path, logs, {"node0": (1, "exited", 1.0), "node1": (None, "lost", 9.0)},
        first_failed="node0")
    assert summary["first_failed"] == "node1"
