"""Settling a run's record from the states its nodes left on the shared filesystem."""

from __future__ import annotations

from orchestrator.node.protocol import STATE_REFRESH, STATE_STALE
from orchestrator.run.settle import summarize

INFO = {"run_id": "r1", "nodes": ["node0", "node1", "node2"]}
NOW = 1_000_000.0


def ended(code: int, reason: str = "exited", why: str = "", at: float = NOW - 5) -> dict:
    return {"state": "ended", "code": code, "reason": reason, "why": why,
            "started": NOW - 100, "ended": at, "time": at}


def running(age: float = 1.0) -> dict:
    return {"state": "running", "started": NOW - 100, "time": NOW - age}


def settled(states: dict[str, dict]) -> dict:
    """summarize() for a run that has ended: its summary (None would fail here)."""
    summary = summarize(INFO, states, NOW)
    assert summary is not None, "the run should have ended"
    return summary.to_json()   # as summary.json has it


def test_still_running_has_no_summary() -> None:
    states = {"node0": running(), "node1": running(), "node2": ended(0)}
    assert summarize(INFO, states, NOW) is None


def test_all_succeeded() -> None:
    s = settled({n: ended(0) for n in INFO["nodes"]})
    assert s["status"] == "succeeded" and s["first_failed"] is None
    assert s["exit_codes"] == {"node0": 0, "node1": 0, "node2": 0}


def test_the_failed_node_is_named_not_the_ones_it_stopped() -> None:
    states = {"node0": ended(143, "peer-failed", "node1", at=NOW - 3),
              "node1": ended(3, at=NOW - 4),
              "node2": ended(143, "peer-failed", "node1", at=NOW - 3)}
    s = settled(states)
    assert (s["status"], s["first_failed"]) == ("failed", "node1")
    assert [n["end_reason"] for n in s["nodes"]] == ["stopped", "exited", "stopped"]
    assert s["nodes"][0]["why"] == "peer-failed node1"


def test_a_node_whose_supervisor_failed_is_the_failed_one() -> None:
    states = {"node0": ended(143, "peer-failed", "node2", at=NOW - 3),
              "node1": ended(143, "peer-failed", "node2", at=NOW - 3),
              "node2": ended(1, "supervisor-failed", "OSError: [Errno 28]", at=NOW - 4)}
    s = settled(states)
    assert (s["status"], s["first_failed"]) == ("failed", "node2")
    assert s["nodes"][2]["end_reason"] == "supervisor-failed"


def test_a_node_that_went_silent_is_lost_and_named() -> None:
    states = {"node0": ended(143, "peer-lost", "node1"), "node1": running(age=3),
              "node2": ended(143, "peer-lost", "node1")}
    s = settled(states)
    assert (s["status"], s["first_failed"]) == ("failed", "node1")
    assert s["nodes"][1]["end_reason"] == "lost"
    # A state file not rewritten for a while is not lost: it is rewritten every
    # STATE_REFRESH, and the share may have stalled meanwhile (half a minute, say).
    states = {"node0": ended(0), "node1": ended(0), "node2": running(age=3 * STATE_REFRESH + 30)}
    assert summarize(INFO, states, NOW) is None
    # Silence alone, long enough (every node of the run gone), also means lost.
    states = {"node0": ended(0), "node1": ended(0), "node2": running(age=STATE_STALE + 1)}
    assert settled(states)["first_failed"] == "node2"


def test_controller_lost_and_stopped() -> None:
    lost = {n: ended(143, "controller-lost") for n in INFO["nodes"]}
    assert settled(lost)["status"] == "controller-lost"
    stopped = {n: ended(143, "stopped") for n in INFO["nodes"]}
    assert settled(stopped)["status"] == "stopped"


def test_the_summary_reads_the_same_in_json_and_in_messages() -> None:
    import json

    states = {"node0": ended(143, "peer-failed", "node1"), "node1": ended(3),
              "node2": ended(143, "peer-failed", "node1")}
    s = settled(states)
    on_disk = json.loads(json.dumps(s))
    assert on_disk["status"] == "failed"
    assert [n["end_reason"] for n in on_disk["nodes"]] == ["stopped", "exited", "stopped"]
    # What `runs` and train's last line print: the value, never "RunStatus.FAILED".
    status = summarize(INFO, states, NOW).status  # type: ignore[union-attr]
    assert f"{status}" == "failed" and str(status) == "failed"


def test_a_lost_node_is_named_over_a_peer_whose_ranks_failed_after_it() -> None:
    """node1 died (no heartbeat since); node2's ranks then failed in gloo and its torchrun
    exited 1 by itself before anyone called node1 lost: node1 went wrong first."""
    silent = STATE_STALE + 10
    states = {"node0": ended(143, "peer-lost", "node1", at=NOW - silent + 8),
              "node1": running(age=silent),
              "node2": ended(1, at=NOW - silent + 2)}
    s = settled(states)
    assert (s["status"], s["first_failed"]) == ("failed", "node1")


def test_a_run_its_nodes_found_hung_is_hung_not_failed() -> None:
    """Each node stopped its part for the hang (killed: code 143), one saw a peer end
    first: nobody failed, the run hung."""
    why = "no rank made progress for 21 s (--hang-timeout 20)"
    s = settled({"node0": ended(143, "hung", why), "node1": ended(143, "hung", why),
                 "node2": ended(143, "hung", "node0")})
    assert s["status"] == "hung" and s["first_failed"] is None
    assert s["nodes"][0]["end_reason"] == "stopped" and "hung" in s["nodes"][0]["why"]


def test_the_nodes_hang_dumps_are_read_as_diagnose_reads_its_own(tmp_path) -> None:
    """Recorded dumps of a real hung job (hang_dumps/stall: rank 2 held up the others),
    as the supervisors write them onto the share, one file per node."""
    import json
    from pathlib import Path

    from orchestrator.record.rundir import RunDir
    from orchestrator.run.settle import read_hang_dumps

    stall = Path(__file__).parents[1] / "hang_dumps" / "stall"
    dumps: dict[str, dict] = {}
    for r in json.loads((stall / "ranks.json").read_text()):
        node = dumps.setdefault(r["node"], {"node": r["node"], "detected_at": NOW,
                                            "quiet_s": 21.0, "ranks": []})
        node["ranks"].append({"rank": r["rank"], "pid": r["pid"],
                              "dump": (stall / f"rank{r['rank']}.json").read_text()})
    hang = read_hang_dumps(dumps, RunDir(tmp_path, "r1"))
    assert [(s["node"], s["rank"]) for s in hang["suspects"]] == [("node1", 2)]
    assert hang["quiet_s"] == 21.0 and hang["found_by"] == "the nodes (detached run)"
    assert (tmp_path / "r1" / "hang" / "report.txt").exists()


def test_a_node_whose_ranks_failed_while_the_others_stopped_for_a_hang_is_no_failure() -> None:
    """Stopping for a hang breaks the other nodes' collectives: a node whose torchrun then
    exited with 1 by itself, a beat before its supervisor stopped it, is not the cause."""
    why = "no rank made progress for 23 s (--hang-timeout 20)"
    s = settled({"node0": ended(1, "exited", at=NOW - 3), "node1": ended(143, "hung", why,
                                                                          at=NOW - 4),
                 "node2": ended(143, "hung", why, at=NOW - 4)})
    assert s["status"] == "hung" and s["first_failed"] is None


def test_a_last_attempts_lost_node_is_kept_in_its_summary_as_cordoned(tmp_path) -> None:
    """The nodes' end of a detached run that may recover no more (node/recover.py decide:
    attempt None) cordoned the node it lost: the summary says so, as an attached run's."""
    from orchestrator.record.rundir import RunDir
    from orchestrator.record.summary import Summary
    from orchestrator.run.settle import recorded

    info = {**INFO, "recovery_plan": {"run_id": "r1"}}
    summary = settled({"node0": ended(143, "peer-lost", "node1"),
                       "node1": running(age=STATE_STALE + 60), "node2": ended(143, "peer-lost",
                                                                          "node1")})
    decision = {"attempt": None, "failed_run": "r1", "node": "node1", "why": "lost (x)",
                "cordoned": True, "drained": False}
    kept = recorded(RunDir(tmp_path, "r1"), info, Summary.from_json(summary),
                    decision).to_json()
    assert kept["cordoned"] == {"node1": "node1 lost mid-run r1 (lost (x))"}
    assert "drained" not in kept and "recovered_in" not in kept
