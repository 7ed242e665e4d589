"""Which scheduler a run goes through: the one choice, made from the run."""

from __future__ import annotations

from typing import cast

import pytest

from orchestrator.cluster.inventory import NodeSpec
from orchestrator.cluster.nodelib import NodeAnswerError
from orchestrator.cluster.ssh import Connection, Result, SshTarget
from orchestrator.run.scheduler import (
    SlurmScheduler,
    SshScheduler,
    scheduler_for,
    slurm_job_of,
    stop_job,
)

from ..local_node import Canned


def test_a_run_that_holds_a_slurm_job_goes_through_slurm_else_over_ssh() -> None:
    queued = {"run_id": "r1", "slurm": {"job_id": "17", "nodes": ["node0"]}}
    plain = {"run_id": "r2", "slurm": None}
    assert slurm_job_of(queued) == "17"
    assert slurm_job_of(plain) is None and slurm_job_of({"run_id": "r3"}) is None
    chosen = scheduler_for(slurm_job_of(queued))
    assert isinstance(chosen, SlurmScheduler) and chosen.job == "17"
    assert type(scheduler_for(slurm_job_of(plain))) is SshScheduler


def test_a_node_whose_states_are_cut_short_is_one_that_did_not_answer() -> None:
    """The next node is asked; when none answers, the error `status` says names each
    node and what it said (not a JSONDecodeError's traceback)."""
    nodes = [(NodeSpec(n, SshTarget(n), n), "/s/r1") for n in ("n0", "n1")]
    clients = {"n0": Canned(Result(0, '{"states": {"r1": {"rank": 0', "")),
               "n1": Canned(Result(2, "", "FileNotFoundError: /s/r1\n"))}
    scheduler = SshScheduler(cast(dict[str, Connection], clients))
    with pytest.raises(OSError) as caught:
        scheduler.describe(nodes)
    assert str(caught.value) == (
        'no node of the run answered: n0: its answer was cut short: {"states": {"r1": '
        '{"rank": 0; n1: FileNotFoundError: /s/r1')
    clients["n1"] = Canned(Result(0, '{"states": {}, "now": 5}\n', ""))
    assert scheduler.describe(nodes).now == 5.0


def test_a_stop_answered_with_no_json_names_the_node_as_a_failed_stop_does() -> None:
    """A RuntimeError (what follow's stop thread and `stop` say), not a JSONDecodeError."""
    for result, said in [(Result(0, "Killed\n", ""), "its answer was not JSON: Killed"),
                         (Result(1, "", "PermissionError: 4242\n"), "PermissionError: 4242")]:
        with pytest.raises(NodeAnswerError) as caught:
            stop_job(cast(Connection, Canned(result)), "/usr/bin/python3", "r1", 5, node="n1")
        assert isinstance(caught.value, RuntimeError)
        assert str(caught.value) == f"n1: `node.py stop` failed: {said}"
