"""Which ends start a run again, on which nodes, and what the record says of each
recovery (orchestrator/run/recovery.py). The recovery itself, a node's container killed
mid-run: tests/e2e/test_cluster.py's
test_a_killed_node_is_replaced_by_a_spare_and_the_run_resumes."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import LaunchError
from orchestrator.record.summary import Recovery, Summary
from orchestrator.run.recovery import (
    RECOVERY_ENV,
    Failure,
    SpareFacts,
    attempt_id,
    attempt_info,
    detached_plan,
    exhausted,
    next_nodes,
    node_failure,
    spares_of,
)


def summary(node1: dict, status: str = "failed", ranks: dict | None = None) -> Summary:
    return Summary.from_json({
        "run_id": "r", "status": status, "duration_s": 1.0, "first_failed": "node1",
        "end": "2026-11-26T03:00:10+00:00",
        "nodes": [{"name": "node0", "exit_code": -15, "end_reason": "stopped"},
                  {"name": "node1", **node1}],
        "rank_exit_codes": {"node1": ranks or {}}})


@pytest.mark.parametrize("node1, ranks, why", [
    ({"exit_code": None, "end_reason": "lost", "why": "no answer to SSH keepalive for 8 s"},
     None, "lost (no answer to SSH keepalive for 8 s)"),
    ({"exit_code": None, "end_reason": "supervisor-failed"}, None,
     "its supervisor failed"),
    ({"exit_code": -9, "end_reason": "exited"}, None, "its torchrun was killed (SIGKILL)"),
    # The supervisor writes a torchrun killed by signal N as 128+N.
    ({"exit_code": 137, "end_reason": "exited"}, None, "its torchrun was killed (SIGKILL)"),
    ({"exit_code": 1, "end_reason": "exited"}, {"2": -9, "3": -15},
     "rank 2 killed (SIGKILL)"),
    ({"exit_code": 1, "end_reason": "exited"}, {"2": -7}, "rank 2 killed (SIGBUS)"),
])
def test_a_nodes_fault_is_recovered(node1: dict, ranks: dict | None, why: str) -> None:
    failure = node_failure(summary(node1, ranks=ranks))
    assert failure == Failure("r", "node1", why, node1["end_reason"] == "lost",
                              "2026-11-26T03:00:10+00:00")


@pytest.mark.parametrize("node1, ranks, status", [
    # The script raised (every rank's own exit code 1): the script's, not the node's.
    ({"exit_code": 1, "end_reason": "exited"}, {"2": 1, "3": 1}, "failed"),
    # sys.exit(3) on one rank, another rank killed in the teardown that followed.
    ({"exit_code": 1, "end_reason": "exited"}, {"2": 3, "3": -9}, "failed"),
    # A stop (SIGTERM) is nobody's fault; nor are a hang, a stop or a success.
    ({"exit_code": -15, "end_reason": "exited"}, {"2": -15}, "failed"),
    ({"exit_code": 143, "end_reason": "exited"}, None, "failed"),
    # A script's own sys.exit(137) is its code, not a signal: torchrun ends with 1.
    ({"exit_code": 1, "end_reason": "exited"}, {"2": 137}, "failed"),
    ({"exit_code": None, "end_reason": "lost"}, None, "hung"),
    ({"exit_code": None, "end_reason": "lost"}, None, "stopped"),
    ({"exit_code": 0, "end_reason": "exited"}, None, "succeeded"),
])
def test_anything_else_is_not_retried(node1: dict, ranks: dict | None, status: str) -> None:
    assert node_failure(summary(node1, status, ranks)) is None


def test_a_spare_takes_the_failed_nodes_place_and_then_fewer_nodes_if_allowed() -> None:
    spares = ["node2"]
    assert next_nodes(["node0", "node1"], "node0", spares, None) == (["node1", "node2"],
                                                                     "node2")
    assert spares == []
    assert next_nodes(["node1", "node2"], "node2", spares, 1) == (["node1"], None)
    with pytest.raises(LaunchError, match=r"node1 failed and no spare node is left to take "
                       r"its place, and 0 healthy node\(s\) are fewer than --min-nodes 1"):
        next_nodes(["node1"], "node1", spares, 1)
    with pytest.raises(LaunchError, match="hold spares ready"):
        next_nodes(["node0", "node1"], "node1", [], None)


def test_spares_are_nodes_of_the_inventory_that_the_run_does_not_use() -> None:
    names, inv = ["n0", "n1", "n2", "n3"], Path("hosts.yml")
    assert spares_of(names, ["n0", "n1"], 2, None, inv) == ["n2", "n3"]
    assert spares_of(names, ["n0", "n1"], 0, ["n3"], inv) == ["n3"]
    with pytest.raises(LaunchError, match="--spares 3: hosts.yml has 2 node"):
        spares_of(names, ["n0", "n1"], 3, None, inv)
    with pytest.raises(LaunchError, match="n9 is not a node of hosts.yml"):
        spares_of(names, ["n0"], 0, ["n9"], inv)
    with pytest.raises(LaunchError, match="n0 is one of the run's own nodes"):
        spares_of(names, ["n0"], 0, ["n0"], inv)


def test_a_recovery_is_timed_from_the_failure_to_the_first_step_again() -> None:
    r = Recovery(1, "r", "node1", "lost (x)", "2026-11-26T03:00:10+00:00", attempt_id("r", 1),
                 ["node0", "node2"], "node2", True)
    log = ("node0/rank0 | resumed from /mnt/cluster/checkpoints/alice/j/ckpt-000001-0000000.pt "
           "in 0.42 s: epoch 1, step 0 (global step 40)\n")
    r.last_heard_at = "2026-11-26T03:00:08+00:00"
    r = r.completed("2026-11-26T03:00:14+00:00", "2026-11-26T03:00:31.500+00:00", log,
                    last_step=57)
    assert (r.run_id, r.restart_s, r.resume_s, r.down_s, r.load_s, r.steps_lost) == (
        "r.r1", 4.0, 17.5, 21.5, 0.42, 17)
    assert r.silent_s == 23.5   # from the lost node's last heartbeat
    assert r.resumed_from == {"checkpoint": "/mnt/cluster/checkpoints/alice/j/ckpt-000001-"
                              "0000000.pt", "epoch": 1, "step": 40}
    assert r.line() == (
        "recovery 1: node1 lost (x) at 2026-11-26T03:00:10+00:00; node2 took its place, as "
        "r.r1 on node0, node2; training again 21.5 s later, 23.5 s after its last heartbeat "
        "(torchrun restarted after 4.0 s, "
        "first step 17.5 s after that, checkpoint loaded in 0.42 s); resumed from "
        "/mnt/cluster/checkpoints/alice/j/ckpt-000001-0000000.pt (epoch 1, step 40, 17 "
        "step(s) done again)")


def test_recoveries_used_up_name_each_failure() -> None:
    err = exhausted("r", [Failure("r", "node1", "lost (a)", True, "T1"),
                          Failure("r.r1", "node2", "rank 3 killed (SIGKILL)", False, "T2")], 1)
    assert str(err) == (
        "run r failed: its node failed 2 time(s) and --max-recoveries 1 allowed 1 recovery: "
        "r: node1 lost (a) at T1; r.r1: node2 rank 3 killed (SIGKILL) at T2. The nodes lost "
        "are cordoned; each attempt's logs are in its own record")


# -- a detached run: the nodes start the next attempt (node/recover.py) --------------------

def first_command(**changes):
    from orchestrator.run.command import NodeCommand
    base = dict(run_id="R", node_rank=0, nnodes=2, nproc=2, master_addr="10.0.0.10",
                master_port=29500, torchrun="/home/alice/env/bin/torchrun", home="/home/alice",
                script="train.py", script_args=("--epochs", "3"),
                env={"CLUSTERTRAIN_BACKEND": "gloo", "LR": "0.1", RECOVERY_ENV: "0"},
                node="node0", nodes=("node0", "node1"), addresses=("10.0.0.10", "10.0.0.11"),
                run_state="/mnt/cluster/runs/alice/R", attached=False, recovery=True)
    return NodeCommand(**{**base, **changes})


def test_a_filled_in_template_is_the_line_the_controller_would_have_sent() -> None:
    """The spare's part of attempt 1, as the nodes fill in the plan, is the very line a
    controller would send it over SSH; and run.json's record of that attempt (attach,
    stop, runs) rebuilds that command."""
    from orchestrator.node.recover import fill
    spare = SpareFacts("10.0.0.12", "/usr/bin/python3", "/home/alice/env2/bin/torchrun",
                       "/home/alice")
    plan = detached_plan([first_command(), first_command(node_rank=1, node="node1")],
                         {"node2": spare}, 1, None, "/mnt/cluster", True, True, "sudo")
    decision = {"attempt": 1, "run_id": "R.r1", "failed_run": "R", "node": "node1",
                "why": "lost (x)", "failed_at": 1.0e9, "last_heard_at": None,
                "nodes": ["node0", "node2"], "addresses": ["10.0.0.10", "10.0.0.12"],
                "spare": "node2", "cordoned": True}
    wanted = first_command(run_id="R.r1", node_rank=1, node="node2",
                           nodes=("node0", "node2"), addresses=("10.0.0.10", "10.0.0.12"),
                           run_state="/mnt/cluster/runs/alice/R.r1",
                           torchrun=spare.torchrun, python=spare.python,
                           env={**first_command().env, RECOVERY_ENV: "1"})
    assert fill(plan, decision, "node2", spare.python, spare.torchrun,
                spare.home) == wanted.shell()
    info = {"nodes": ["node0", "node1"], "recovery_plan": plan,
            "users": {"node0": "alice", "node1": "alice"},
            "node_commands": {c.node: c.to_record() for c in (
                first_command(), first_command(node_rank=1, node="node1"))}}
    recorded = attempt_info(info, decision)
    from orchestrator.run.command import NodeCommand
    assert NodeCommand.from_record(recorded["node_commands"]["node2"]) == wanted
    assert recorded["nodes"] == ["node0", "node2"] and recorded["run_id"] == "R.r1"
    assert recorded["users"] == {"node0": "alice", "node2": "alice"}
    told = Recovery.from_json(recorded["recovery"])
    assert (told.attempt, told.node, told.spare, told.failed_run) == (1, "node1", "node2", "R")
