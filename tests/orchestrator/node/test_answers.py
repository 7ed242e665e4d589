"""Each node verb's answer, declared once (orchestrator/node/answers.py): what the node
writes (to_json) the controller reads back (from_json) as the same answer, and an answer
of another shape is refused naming its field. The real node program's answers, read
through nodelib: tests/orchestrator/cluster/test_nodelib.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.node import __main__ as verbs, requests as rq
from orchestrator.node.answers import (
    Answer,
    AnswerError,
    Busy,
    CarryAnswer,
    Check,
    CordonAnswer,
    DuAnswer,
    DumpAnswer,
    EnvsAnswer,
    GpuProcess,
    HealthAnswer,
    LiveRun,
    NodeEnv,
    ProbeAnswer,
    RankDump,
    ReachAnswer,
    RunUsage,
    SlurmUsage,
    SlurmUser,
    StatesAnswer,
    StopAnswer,
    TorchAnswer,
    Unread,
    UsageAnswer,
    UserUsage,
)

RUN = RunUsage("r1", "alice", ["n0", "n1"], 1000.0, None, 2.0, 4.0, 1.5)
BOB = LiveRun("20260101-120000-a1b2c3", "bob", [5151], [0, 1], slurm_job="41")
REACHED = ReachAnswer(token=Check(True), connect=Check(False, "Connection refused"),
                      strangers=[{"addr": "192.0.2.66", "said": "stop 1a2b"}],
                      seconds=0.25, addr="10.0.0.1", port=29500)

# One answer of every verb that answers, with every kind of field filled in.
EXAMPLES: dict[type[rq.Request], Answer] = {
    rq.Stop: StopAnswer(found=True, user="alice", killed=[4243], left=[],
                        initial=[4242, 4243], pgid=4242),
    rq.Dump: DumpAnswer([RankDump(0, 4242, dump='[{"thread_id": 1}]', fr="eJwDAAAAAAE="),
                         RankDump(1, 4243, error="py-spy: permission denied",
                                  fr_error="the worker serves no flight recorder")]),
    rq.Probe: ProbeAnswer(user="alice", uid=1001, home="/home/alice",
                          machine={"hostname": "n1", "boot_id": "b"},
                          fingerprint={"sha256": "ab", "packages": {"torch": "2.13.0"}},
                          cluster_env={"NCCL_SOCKET_IFNAME": "eth1"},
                          torch={"ok": True, "gpus": 2}, gpu_count=2, gpu_source="nvidia-smi -L",
                          busy=Busy(runs=[BOB]), health_warnings=["/tmp is 95 % full"],
                          shared={"ok": True, "kind": None}, space=[{"what": "home", "free": 5}],
                          port_free=False, free_port=29501, reach=REACHED,
                          resolve={"n0": "10.0.0.1", "n9": None}, seconds=1.5,
                          time=1700000000.5),
    rq.Reach: REACHED,
    rq.Busy: Busy(runs=[BOB], gpu_processes=[GpuProcess(77, "GPU-1", 1, 300, "carol",
                                                        "python x.py")], hidden=True,
                  error="nvidia-smi --query-gpu: failed"),
    rq.Envs: EnvsAnswer(root="/h/.clustertrain/envs", now=1000.0, envs=[NodeEnv(
        "proj", "aaaaaaaaaaaa", "/h/.clustertrain/envs/proj-aaaaaaaaaaaa", current=True,
        complete=True, backend="venv", fingerprint="0123456789ab", packages=12,
        size=1 << 20, last_used=999.5, in_use=[4242])],
        removed=["/h/.clustertrain/envs/proj-bbbbbbbbbbbb"], in_use={"/h/x": [7]}),
    rq.States: StatesAnswer({"n0": {"state": "running", "time": 999.0}}, 1000.0,
                            hang={"n0": {"ranks": []}}, next={"attempt": 1, "nodes": ["n0"]}),
    rq.Cordon: CordonAnswer(cordoned={"n1": {"why": "bad GPU", "held_by": ["alice"]}},
                            ignored=[{"file": "n1@1@bob.json", "by": "bob", "why": "late"}],
                            event={"node": "n1", "action": "uncordon"},
                            lifted=[{"node": "n1", "by": "alice"}], refused="not yours",
                            error="read-only"),
    rq.Health: HealthAnswer({"node": "n0", "failing": []},
                            history={"n1": [{"time": 10.0, "event": "failing"}]},
                            runs_failed={"n2": [{"run": "r1", "time": 5.0}]},
                            cordoned={"n2": {"why": "lost"}}),
    rq.Du: DuAnswer("/mnt/s", 10, 100, {"alice": {"data": 5, "other": 0}},
                    [Unread("/mnt/s/checkpoints/bob", "bob", "Permission denied")]),
    rq.Usage: UsageAnswer(0.0, [RUN], {"alice": UserUsage(1, 2.0, 4.0, 1.5)}, [RUN], [],
                          [Unread("/mnt/s/checkpoints/x/.clustertrain/runs/r", "bob",
                                  "its owner is bob")],
                          slurm=SlurmUsage({"alice": SlurmUser(2, 1.5, 3.0)}, None)),
    rq.Torch: TorchAnswer("ok", "2.13.0", distributed=True, nccl=True, cuda_available=True,
                          gpu_count=2, pci_gpus=2, driver_gpus=2),
    rq.Carry: CarryAnswer("r0", ["snapshot.pt"], ["train.py"], copied=False),
}


def test_every_verb_names_its_answer_and_every_answer_has_an_example_here() -> None:
    answering = {v.request for v in verbs.VERBS.values() if v.request.ANSWER is not None}
    assert answering == set(EXAMPLES)
    assert all(type(answer) is request.ANSWER for request, answer in EXAMPLES.items())


def test_the_verbs_that_answer_nothing_say_so() -> None:
    silent = {v.request for v in verbs.VERBS.values() if v.request.ANSWER is None}
    assert silent == {rq.Supervise, rq.Follow, rq.Standby, rq.RecoveryPlan, rq.Unlisten,
                      rq.Release, rq.Allocate}
    with pytest.raises(TypeError, match="`node.py release` answers nothing"):
        rq.Release("r1").read_answer({})


@pytest.mark.parametrize(("request_", "answer"), EXAMPLES.items(),
                         ids=lambda x: getattr(x, "VERB", ""))
def test_an_answer_reads_back_the_same_through_json(request_: type[rq.Request],
                                                    answer: Answer) -> None:
    assert request_.ANSWER is not None
    assert request_.ANSWER.from_json(json.loads(json.dumps(answer.to_json()))) == answer


def test_a_field_whose_name_python_keeps_is_its_key_in_json() -> None:
    """carry's `from` (sync.py reads the key): the field from_, the key from."""
    data = EXAMPLES[rq.Carry].to_json()
    assert data == {"from": "r0", "carried": ["snapshot.pt"], "kept_code": ["train.py"],
                    "copied": False}


def test_a_left_out_field_with_a_default_is_its_default_and_a_whole_number_a_float() -> None:
    stop = StopAnswer.from_json({"found": False, "user": "alice", "killed": [], "left": []})
    assert stop == StopAnswer(False, "alice", [], [])
    now = StatesAnswer.from_json({"states": {}, "now": 5}).now
    assert now == 5.0 and isinstance(now, float)


STOPPED = {"found": True, "user": "alice", "killed": [], "left": []}


@pytest.mark.parametrize(("kind", "data", "field", "why"), [
    (StopAnswer, {k: v for k, v in STOPPED.items() if k != "left"}, "left", "is missing"),
    (StopAnswer, {**STOPPED, "killed": ["4242"]}, "killed[0]",
     "is a string ('4242'), not int"),
    (StopAnswer, {**STOPPED, "found": 1}, "found", "is a number (1), not bool"),
    (StopAnswer, {**STOPPED, "pgid": True}, "pgid", "is a bool (true), not int or null"),
    (StatesAnswer, {"states": {}, "now": "soon"}, "now", "is a string ('soon'), not float"),
    (StatesAnswer, {"states": [], "now": 1.0}, "states",
     "is a list, not dict[str, dict[str, Any]]"),
    (DumpAnswer, {"ranks": [{"rank": 0}]}, "ranks[0].pid", "is missing"),
    (UsageAnswer, {**EXAMPLES[rq.Usage].to_json(), "users": {"alice": {
        "runs": True, "node_hours": 1, "gpu_hours": 1, "idle_gpu_hours": 0}}},
     "users['alice'].runs", "is a bool (true), not int"),
    (ProbeAnswer, {"busy": {"runs": [{"run": "r1"}]}}, "busy.runs[0].user", "is missing"),
    (ReachAnswer, {"connect": {"ok": "yes"}}, "connect.ok", "is a string ('yes'), not bool"),
    (CarryAnswer, {"carried": [], "kept_code": [], "copied": False}, "from", "is missing"),
], ids=["missing", "item", "bool", "int-not-bool", "float", "dict", "nested",
        "in-a-dict", "deeper", "check", "key"])
def test_an_answer_of_another_shape_is_refused_naming_its_field(
        kind: type[Answer], data: dict[str, Any], field: str, why: str) -> None:
    with pytest.raises(AnswerError) as caught:
        kind.from_json(data)
    assert (caught.value.field, caught.value.why) == (field, why)
    assert str(caught.value) == f"{field} {why}"


def test_an_answer_that_is_no_object_is_refused() -> None:
    with pytest.raises(AnswerError, match="the answer is a list, not an object"):
        StopAnswer.from_json([])


def test_a_request_of_what_is_no_answer_is_refused_where_it_is_declared() -> None:
    with pytest.raises(TypeError, match="Odd is a Request of <class 'dict'>: an "):
        class Odd(rq.Request[dict]):
            VERB = "odd"
