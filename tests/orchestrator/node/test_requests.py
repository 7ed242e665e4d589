"""Each node verb's request, declared once (orchestrator/node/requests.py): the command
line the controller writes for it is read back, by the node program's own parser, as the
same request; what a field says of itself (required, default, choices) is what the node
enforces. The verbs themselves, run on a local node: test_verbs.py."""

from __future__ import annotations

import shlex

import pytest

from orchestrator.node import __main__ as verbs
from orchestrator.node.protocol import GRACE, KEEP_RUNS
from orchestrator.node.requests import Dump, Follow, Request, Stop, Supervise
from orchestrator.run.command import NodeCommand

REQUESTS: list[Request] = [
    Supervise(job="/h/j", state_dir="/s/r", run="r1", node="n0", nodes=("n0", "n1"),
              addresses=("10.0.0.1", "10.0.0.2"), cwd="/h/c", grace=2.5, attached=True,
              hang_timeout=90.0, on_hang="wait", keep_runs=3, wait_go=True,
              ring_ports="29400-29499", recovery=True,
              rest=("torchrun", "--nnodes", "2", "--", "train.py", "--lr", "0.1")),
    Supervise(job="/h/j", state_dir="/s/r", run="r1", node="n0", nodes=("n0",)),
    Follow(job="/h/j", tail=40, lease=True),
    Follow(job="/h/j", from_line=12),
    Stop("jobs", "r1", 7.5),
    Dump("jobs", "r1", "/opt/env/bin/py-spy", native=True),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
def test_a_request_reads_back_the_same_through_the_node_programs_parser(
        request_: Request) -> None:
    args = verbs._parser(request_.VERB).parse_args([request_.VERB, *request_.argv()])
    assert type(request_).from_args(args) == request_


def test_the_defaults_are_the_node_protocols_and_a_missing_option_is_refused(capsys) -> None:
    least = REQUESTS[1]
    assert isinstance(least, Supervise)
    assert (least.grace, least.keep_runs, least.on_hang) == (GRACE, KEEP_RUNS, "stop")
    with pytest.raises(SystemExit):
        verbs._parser("supervise").parse_args(["supervise", "--job", "/h/j"])
    assert "the following arguments are required: --state-dir, --run, --node, --nodes" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit):
        verbs._parser("supervise").parse_args([*shlex.split(
            "supervise --job j --state-dir s --run r --node n --nodes n --on-hang later")])
    assert "invalid choice: 'later'" in capsys.readouterr().err


def test_the_controllers_launch_line_is_a_supervise_request(tmp_path) -> None:
    """NodeCommand.shell() writes its supervisor's line from the request: the run's
    options reach the node as the node reads them (--keep-runs, not a second name)."""
    command = NodeCommand(run_id="r1", node_rank=1, nnodes=2, nproc=1, master_addr="n0",
                          master_port=29500, torchrun="/e/bin/torchrun", home="/home/alice",
                          script="train.py", node="n1", nodes=("n0", "n1"),
                          run_state="/s/r1", keep_runs=4, grace=12.0, on_hang="wait")
    line = shlex.split(command.shell().rsplit("exec ", 1)[1])
    at = line.index("supervise")
    request = Supervise.from_args(verbs._parser("supervise").parse_args(line[at:]))
    assert (request.keep_runs, request.grace, request.on_hang, request.nodes) == (
        4, 12.0, "wait", ("n0", "n1"))
    assert request.rest == tuple(command.torchrun_argv()) and request.wait_go
