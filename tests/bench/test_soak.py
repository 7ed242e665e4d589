"""The soak's parts that need no cluster (bench/soak/): each invariant on a history that
keeps it and on one that breaks it, the violation naming what a person needs to find it;
a stored record read as the invariants see it; the schedule, from its seed alone."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import datetime
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from soak import invariants as inv, observe, plan as soak_plan  # noqa: E402
from soak.history import Cordon, Event, Hold, ProcessSeen, RunSeen, Sample, around  # noqa: E402

from orchestrator.record.summary import NOT_STARTED  # noqa: E402

OK = RunSeen("r1", "alice", "succeeded", 10.0, 70.0, ("node0", "node1"),
             shown=("node0/0 | step 10 loss 0.3", "node0/0 | done"))

# What a 2-node run that succeeded once showed (torchrun's store, gone first on node 0).
TCPSTORE = (
    "[W1207 12:00:01 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=3): "
    "Failed to recv, got 0 bytes. Connection was likely closed.",
    "Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:671",
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98",
)


def names(found: list) -> list[str]:
    return [v.what for v in found]


def test_a_success_that_shows_a_stack_is_named_with_its_lines() -> None:
    noisy = RunSeen("r2", "bob", "succeeded", 0.0, 50.0, shown=("step 1", *TCPSTORE))
    failed = RunSeen("r3", "bob", "failed", 0.0, 5.0,
                     shown=("Traceback (most recent call last):", '  File "x.py", line 3'))
    found = inv.no_stack_in_a_success(inv.Seen(runs=[OK, noisy, failed]))
    assert names(found) == ["r2 of bob succeeded and showed 2 line(s) of a stack"]
    assert found[0].evidence["lines"] == list(TCPSTORE[1:])
    assert found[0].at == 50.0


def test_a_gpu_held_by_two_runs_at_once_is_named_whichever_records_saw_it() -> None:
    holds = [Hold("run", "r1", "node0", 0, 10.0, 70.0),
             Hold("slurm", "41", "node0", 0, 5.0, 75.0),      # r1's own job: the same holder
             Hold("run", "r2", "node0", 1, 10.0, 70.0),       # another GPU
             Hold("run", "r4", "node0", 0, 75.0, 90.0)]       # once r1's job ended
    seen = inv.Seen(holds=holds, jobs={"41": "r1"})
    assert inv.no_gpu_held_twice(seen) == []
    # A run started beside the queue on a GPU Slurm gave its job 42 (for r5).
    seen = inv.Seen(holds=[*holds, Hold("slurm", "42", "node0", 1, 60.0, None)],
                    jobs={"41": "r1", "42": "r5"})
    found = inv.no_gpu_held_twice(seen)
    assert names(found) == ["node0 GPU 1 held by r2 and r5 at once"]
    assert found[0].at == 60.0
    # A job nobody's run knows of is named by its id.
    seen = inv.Seen(holds=[*holds, Hold("slurm", "43", "node0", 0, 82.0, 85.0)], jobs={"41": "r1"})
    assert names(inv.no_gpu_held_twice(seen)) == ["node0 GPU 0 held by r4 and slurm job 43 at once"]


def test_a_process_alive_after_its_runs_end_is_named() -> None:
    seen = inv.Seen(runs=[OK], processes=[
        ProcessSeen(60.0, "node0", 101, "r1", "alice"),            # before the end
        ProcessSeen(75.0, "node1", 102, "r1", "alice"),            # within the slack
        ProcessSeen(95.0, "node1", 103, "r1", "alice", "torchrun"),
        ProcessSeen(95.0, "node1", 104, "r9", "bob")])              # a run with no record here
    found = inv.no_process_after_its_end(seen)
    assert names(found) == ["node1: pid 103 of r1 (alice) alive 25 s after its record ended"]


def test_a_record_ends_and_as_its_history_allows() -> None:
    stopped = RunSeen("r2", "alice", "failed", 0.0, 9.0, allowed=("stopped",))
    gone = RunSeen("r3", "bob", "running", 5.0, None)
    found = inv.ends_as_it_happened(inv.Seen(runs=[OK, stopped, gone]))
    assert names(found) == ["r2 of alice ended 'failed'; what happened to it allows stopped",
                            "r3 of bob still says 'running' after the soak"]


def test_a_run_allowed_to_recover_does_not_end_failed() -> None:
    lost = RunSeen("r2", "carol", "failed", 0.0, 40.0, may_recover=True)
    fine = RunSeen("r3", "carol", "succeeded", 0.0, 40.0, may_recover=True)
    assert names(inv.recoverable_runs_finish(inv.Seen(runs=[OK, lost, fine]))) == [
        "r2 of carol could recover and ended 'failed'"]


def test_a_checkpoint_reported_saved_is_there_and_loads() -> None:
    run = RunSeen("r2", "alice", "succeeded", 0.0, 40.0, saved=("/c/a.pt", "/c/b.pt", "/c/c.pt"))
    seen = inv.Seen(runs=[run], checkpoints={"/c/a.pt": True, "/c/b.pt": False})
    assert names(inv.saved_checkpoints_load(seen)) == [
        "r2 of alice reported /c/b.pt saved; it is unreadable",
        "r2 of alice reported /c/c.pt saved; it is missing"]


def test_a_cordon_left_says_why() -> None:
    seen = inv.Seen(cordons=[Cordon("node1", "health", "share stalled"),
                             Cordon("node2", "bob", "  ")])
    assert names(inv.cordons_have_reasons(seen)) == ["node2 is cordoned by bob with no reason"]


def test_only_its_user_and_the_admins_change_a_run() -> None:
    run = RunSeen("r2", "alice", "stopped", 0.0, 40.0, changed_by=("alice", "root", "bob"))
    found = inv.nobody_changed_anothers_run(inv.Seen(runs=[run], admins=frozenset({"root"})))
    assert names(found) == ["bob changed r2 of alice"]


def test_growth_without_bound_is_named_and_a_flat_or_noisy_one_is_not() -> None:
    mib = 1 << 20
    flat = [Sample(t, "ui", rss=100 * mib + (t % 3) * mib, fds=20, threads=5) for t in range(12)]
    leak = [Sample(t, "supervisor node0 r1", rss=50 * mib + t * 10 * mib, fds=10 + 4 * t,
                   threads=3) for t in range(12)]
    few = [Sample(t, "web view", rss=t * 100 * mib) for t in range(5)]
    found = inv.bounded(inv.Seen(samples=[*flat, *leak, *few]))
    assert names(found) == ["supervisor node0 r1: rss grew from 80 MiB to 160 MiB",
                            "supervisor node0 r1: fds grew from 22 to 54"]


def test_check_runs_every_invariant_and_a_clean_history_breaks_none() -> None:
    results = inv.check(inv.Seen(runs=[OK], holds=[Hold("run", "r1", "node0", 0, 10.0, 70.0)]))
    assert set(results) == set(inv.INVARIANTS) and len(results) == 10
    assert all(found == [] for found in results.values()), results


def test_a_violation_comes_with_the_actions_and_faults_around_it() -> None:
    history = [Event(1.0, "alice", "invoke", "train --detach", {"nodes": 2}),
               Event(50.0, "nemesis", "fault", "kill-node", {"node": "node1"}),
               Event(55.0, "bob", "invoke", "stop", {"run": "r1"}, "refused"),
               Event(400.0, "carol", "invoke", "notebook")]
    near = around(history, 60.0, before=30.0, after=5.0)
    assert [e.what for e in near] == ["kill-node", "stop"]
    assert near[1].line() == "     55.0 s  bob      invoke stop run=r1 -> refused"


RECORDS = Path(__file__).resolve().parents[1] / "orchestrator" / "record" / "records"


def stored(name: str):  # noqa: ANN201 - a Summary
    from orchestrator.record.summary import Summary
    return Summary.from_json(json.loads((RECORDS / name).read_text()))


def test_a_stored_record_is_read_as_the_invariants_see_it() -> None:
    """A real run's summary (stored from a sandbox run): on the soak's clock, its nodes,
    the checkpoints its log says it saved, and the GPUs it held (none on these nodes but
    what the test says they have: every GPU of each node, as a run beside the queue)."""
    summary = stored("summary-v2-recovered.json")
    t0 = datetime.fromisoformat("2026-12-07T19:00:00+00:00").timestamp()
    shown = ("node0/0 | checkpoint /mnt/cluster/checkpoints/alice/c/ep1.pt (0.12s)",
             "node0/0 | checkpoint /mnt/cluster/checkpoints/alice/c/ep2.pt (0.10s)",
             "node0/0 | checkpoint /mnt/cluster/checkpoints/alice/c/ep2.pt (0.11s)")
    seen = observe.run_seen(summary, "alice", t0, shown, may_recover=True)
    assert (seen.run_id, seen.status, seen.nodes) == (
        "20261207-190025-4c07be.r1", "failed", ("node0", "node2"))
    assert round(seen.start, 3) == 37.088 and round(seen.end or 0, 3) == 43.209
    assert seen.saved == ("/mnt/cluster/checkpoints/alice/c/ep1.pt",
                          "/mnt/cluster/checkpoints/alice/c/ep2.pt")
    assert names(inv.recoverable_runs_finish(inv.Seen(runs=[seen]))) == [
        "20261207-190025-4c07be.r1 of alice could recover and ended 'failed'"]
    holds = observe.holds_of(summary, t0, {"node0": 2, "node2": 2})
    assert [(h.node, h.gpu) for h in holds] == [("node0", 0), ("node0", 1), ("node2", 0),
                                                ("node2", 1)]
    queued = dataclasses.replace(summary, info={**summary.info, "slurm": {
        "job_id": "41", "nodes": ["node0", "node2"], "gpus": {"node0": [1], "node2": [0]}}})
    assert [(h.node, h.gpu) for h in observe.holds_of(queued, t0, {"node0": 2})] == [
        ("node0", 1), ("node2", 0)]
    # refused before its launch on node2 (a spare that could not take its place, say):
    # the run held nothing there (the soak's first runs counted it)
    refused = dataclasses.replace(summary, nodes=(summary.nodes[0], dataclasses.replace(
        summary.nodes[1], end_reason=NOT_STARTED)))
    assert [(h.node, h.gpu) for h in observe.holds_of(refused, t0, {"node0": 2, "node2": 2})
            ] == [("node0", 0), ("node0", 1)]


def test_the_schedule_is_its_seeds_and_an_hour_holds_what_the_soak_needs() -> None:
    """One seed, one schedule (a violation is reproduced by its seed); an hour of it uses
    every verb of a researcher and of the admin, at least 20 faults of every kind, the
    pusher's attacks on the others only; stop and attach act on the user's own runs."""
    hour = soak_plan.plan(7, 3600)
    assert hour == soak_plan.plan(7, 3600) and hour != soak_plan.plan(8, 3600)
    assert [a.t for a in hour] == sorted(a.t for a in hour) and hour[-1].t < 3600
    by_actor: dict[str, set[str]] = {}
    for a in hour:
        by_actor.setdefault(a.actor, set()).add(a.verb)
    cast = soak_plan.Cast()
    assert set(soak_plan.USER_VERBS) <= set().union(*(by_actor[u] for u in cast.researchers))
    assert set(soak_plan.ADMIN_VERBS) <= by_actor[cast.admin]
    faults = [a for a in hour if a.actor == "nemesis"]
    assert len(faults) >= 20 and {a.verb for a in faults} == set(soak_plan.FAULTS)
    attacks = [a for a in hour if a.verb in soak_plan.ATTACKS]
    assert attacks and all(a.actor == cast.pusher and a.args["victim"] != cast.pusher
                           for a in attacks)
    starts = {a.ref: a for a in hour if a.verb in soak_plan.STARTS}
    starts_runs = len([a for a in hour if a.verb in soak_plan.STARTS or a.verb == "sweep"])
    assert starts_runs >= 100
    for a in hour:
        if a.verb in ("stop", "attach"):
            started = starts[a.ref]
            assert started.actor == a.actor and started.t < a.t, a
            if a.verb == "attach":
                assert started.verb in ("train-detach", "train-recover"), a


def test_a_soak_needs_three_researchers_one_of_them_pushing() -> None:
    with pytest.raises(ValueError, match="three researchers"):
        soak_plan.Cast(researchers=("bob", "carol"), pusher="bob")
    with pytest.raises(ValueError, match="the pusher one of them"):
        soak_plan.Cast(pusher="mallory")
