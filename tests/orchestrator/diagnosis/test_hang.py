"""Naming the rank that holds up a hung run (orchestrator/diagnosis/hang.py), on dumps recorded from
real hung gloo jobs (hang_dumps/, see its README: py-spy 0.4.3 and torch 2.13's own
flight-recorder writers, nothing written by hand)."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.diagnosis.hang import (
    Frame,
    HangAnalysis,
    RankId,
    RankStacks,
    analyze_flight_records,
    analyze_stacks,
    blame_survivors,
    collective_in,
    innermost_user_frame,
    locate,
    parse_flight_record,
    parse_pyspy_dump,
    read_flight_record,
    read_pyspy_dump,
)
from orchestrator.errors import DiagnoseError

DUMPS = Path(__file__).parents[1] / "hang_dumps"
JOB = (DUMPS / "hang_job.py").read_text().splitlines()


def where(function: str, marker: str) -> str:
    """function (hang_job.py:N), N the line of hang_job.py that holds `marker`."""
    line = next(i for i, text in enumerate(JOB, 1) if marker in text)
    return f"{function} (hang_job.py:{line})"


STUCK = where("stuck_in_data_loading", "# a rank whose data never arrives")
IDLE = where("between_steps", "# every rank idles here")
TRAIN = where("train_step", "    dist.all_reduce(t)")
SYNC = where("sync_weights", "dist.broadcast(t, src=0)")
OVERLAP = where("overlapped_step", "work.wait()")


def ranks_of(case: str) -> list[RankId]:
    return [RankId(**r) for r in json.loads((DUMPS / case / "ranks.json").read_text())]


def stacks(case: str) -> list[RankStacks]:
    return [read_pyspy_dump(DUMPS / case / f"rank{r.rank}.json", r) for r in ranks_of(case)]


def stacks_analysis(case: str) -> HangAnalysis:
    return analyze_stacks(stacks(case))


def fr_analysis(case: str, ext: str) -> HangAnalysis:
    return analyze_flight_records(read_flight_record(DUMPS / case / f"fr_rank{r.rank}.{ext}", r)
                                  for r in ranks_of(case))


def named(a: HangAnalysis) -> list[tuple[str, int, str | None]]:
    return [(s.node, s.rank, s.frame) for s in a.suspects]


# --- py-spy stacks --------------------------------------------------------------------

def test_a_rank_outside_the_collective_is_named_and_the_others_place_said() -> None:
    a = stacks_analysis("stall")
    assert named(a) == [("node1", 2, STUCK)]
    why = a.suspects[0].why
    assert why == (f"is in {STUCK}, outside any collective; "
                   f"ranks 0, 1, 3 wait in all_reduce, called from {TRAIN}")
    report = a.report()
    assert "rank 2 is outside any collective while the others wait in one" in report
    assert f"suspect: rank 2 on node1 is in {STUCK}, outside any collective" in report
    assert f"ranks 0, 1, 3 (node0: 0, 1; node1: 3): in all_reduce, called from {TRAIN}" in report


def test_a_mismatched_collective_names_the_minority() -> None:
    a = stacks_analysis("mismatch")
    assert named(a) == [("node0", 0, SYNC)]
    assert a.suspects[0].why == (f"waits in broadcast, called from {SYNC}; "
                                 f"ranks 1-3 wait in all_reduce, called from {TRAIN}")
    assert "rank 0 waits elsewhere than the others" in a.report()


def test_a_tie_names_every_rank_and_says_why() -> None:
    a = stacks_analysis("tie")
    assert named(a) == [("node0", 0, SYNC), ("node0", 1, SYNC),
                        ("node1", 2, TRAIN), ("node1", 3, TRAIN)]
    assert all("a tie" in s.why for s in a.suspects)
    assert f"ranks 2, 3 wait in all_reduce, called from {TRAIN}" in a.suspects[0].why
    assert f"ranks 0, 1 wait in broadcast, called from {SYNC}" in a.suspects[3].why
    assert "split evenly" in a.report()


def test_a_healthy_run_names_nobody() -> None:
    a = stacks_analysis("healthy")
    assert a.suspects == []
    assert [(g.collective, g.frame.where if g.frame else None, len(g.ranks))
            for g in a.groups] == [(None, IDLE, 4)]
    assert "no suspect" in a.report()


def test_all_waiting_in_one_collective_names_nobody() -> None:
    """The stall's three waiting ranks alone: the same place, nobody behind."""
    a = analyze_stacks(s for s in stacks("stall") if s.rank.rank != 2)
    assert a.suspects == []
    assert f"every rank waits in all_reduce, called from {TRAIN}" in a.report()


def test_wait_on_an_async_collective_is_seen_in_native_frames() -> None:
    a = stacks_analysis("async_wait")
    assert named(a) == [("node0", 1, STUCK)]
    assert f"ranks 0, 2, 3 wait in wait() on an async collective, called from {OVERLAP}" \
        in a.suspects[0].why


def test_without_native_frames_work_wait_is_not_seen() -> None:
    """The same dumps less their C++ frames: work.wait() is then plain user code."""
    plain = [replace(s, threads=tuple(replace(t, frames=tuple(f for f in t.frames if not f.native))
                                      for t in s.threads)) for s in stacks("async_wait")]
    a = analyze_stacks(plain)
    assert a.suspects == []
    assert {g.collective for g in a.groups} == {None}


def test_the_rank_is_where_its_main_thread_is_not_its_other_threads() -> None:
    """Each rank has a second Python thread (the flight-recorder dumper, user code too)."""
    stall = {s.rank.rank: s for s in stacks("stall")}
    assert all(len(s.threads) == 2 for s in stall.values())
    waiting, stuck = locate(stall[0]), locate(stall[2])
    assert waiting.frame is not None and stuck.frame is not None
    assert (waiting.collective, waiting.frame.where, waiting.thread) == ("all_reduce", TRAIN,
                                                                         "MainThread")
    assert (stuck.collective, stuck.frame.where, stuck.thread) == (None, STUCK, "MainThread")


@pytest.mark.parametrize("path,user", [
    ("/home/a/.clustertrain/code/r1/train.py", True),
    ("/home/a/.clustertrain/code/r1/.clustertrain/run_worker.py", False),
    ("/tmp/w/orchestrator/run_worker.py", False),
    ("/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", False),
    ("/usr/lib/python3/dist-packages/yaml/__init__.py", False),
    ("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", False),
    ("/usr/lib64/python3.12/selectors.py", False),
    ("/src/pytorch/torch/nn/modules/module.py", False),
    ("<frozen importlib._bootstrap>", False),
])
def test_user_frames(path: str, user: bool) -> None:
    assert Frame("f", path, 1).is_user is user


def test_the_collective_is_the_one_user_code_called() -> None:
    c10d = "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    frames = (Frame("c10d::Work::wait", "/v/torch/lib/libtorch_cpu.so", 0, native=True),
              Frame("all_gather", c10d, 10), Frame("all_gather_object", c10d, 20),
              Frame("gather_metrics", "/job/train.py", 5), Frame("barrier", c10d, 30))
    assert collective_in(frames) == "all_gather_object"
    assert collective_in(frames[:1] + frames[3:]) == "wait"
    assert collective_in(frames[3:]) is None  # outer to the user's frame: not where it waits


def test_to_json_has_the_summary_shape() -> None:
    out = json.loads(json.dumps(stacks_analysis("stall").to_json()))
    assert set(out) == {"suspects", "groups"}
    assert out["suspects"] == [{"node": "node1", "rank": 2, "frame": STUCK,
                                "why": stacks_analysis("stall").suspects[0].why}]
    assert [(g["collective"], g["frame"], [r["rank"] for r in g["ranks"]])
            for g in out["groups"]] == [("all_reduce", TRAIN, [0, 1, 3]), (None, STUCK, [2])]
    pids = {r.rank: r.pid for r in ranks_of("stall")}
    assert out["groups"][1]["ranks"] == [{"node": "node1", "rank": 2, "pid": pids[2]}]


# --- flight recorder ------------------------------------------------------------------

@pytest.mark.parametrize("ext", ["pkl", "json"])
def test_flight_recorder_names_the_rank_behind(ext: str) -> None:
    a = fr_analysis("stall", ext)
    assert [(s.node, s.rank) for s in a.suspects] == [("node1", 2)]
    assert a.suspects[0].why.startswith("is behind: its last collective is #2 all_reduce "
                                        "(completed) in process group 0")
    assert "ranks 0, 1, 3 got to #3 all_reduce (scheduled) in process group 0" in a.suspects[0].why
    assert "rank 2 held up the others" in a.report()


@pytest.mark.parametrize("ext", ["pkl", "json"])
def test_flight_recorder_names_a_different_collective_at_one_number(ext: str) -> None:
    a = fr_analysis("mismatch", ext)
    assert [(s.node, s.rank) for s in a.suspects] == [("node0", 0)]
    assert a.suspects[0].why == ("waits at #3 broadcast in process group 0; "
                                 "ranks 1-3 wait at #3 all_reduce in process group 0")
    tie = fr_analysis("tie", ext)
    assert [s.rank for s in tie.suspects] == [0, 1, 2, 3] and "a tie" in tie.suspects[0].why


@pytest.mark.parametrize("case,rank", [("async_wait", 1), ("healthy", None)])
def test_flight_recorder_other_cases(case: str, rank: int | None) -> None:
    for ext in ("pkl", "json"):
        assert [s.rank for s in fr_analysis(case, ext).suspects] == ([rank] if rank else [])


def test_the_pickled_dump_has_call_sites_and_gloo_states_come_from_pg_status() -> None:
    """gloo records no start/end events: every entry stays "scheduled" and only pg_status
    tells completed from pending."""
    r0, r2 = ranks_of("stall")[0], ranks_of("stall")[2]
    waiting = read_flight_record(DUMPS / "stall" / "fr_rank0.pkl", r0)
    assert {e.state for e in waiting.entries} == {"scheduled"}
    seq, entry, state = waiting.last(0)
    assert entry is not None
    assert (seq, entry.op, state) == (3, "all_reduce", "scheduled")
    stuck = read_flight_record(DUMPS / "stall" / "fr_rank2.pkl", r2)
    assert stuck.last(0)[0::2] == (2, "completed")
    assert fr_analysis("stall", "pkl").suspects[0].frame == TRAIN  # its last collective's


def test_pickle_and_json_dumps_read_alike() -> None:
    for r in ranks_of("mismatch"):
        p = read_flight_record(DUMPS / "mismatch" / f"fr_rank{r.rank}.pkl", r)
        j = read_flight_record(DUMPS / "mismatch" / f"fr_rank{r.rank}.json", r)
        assert p.status == j.status and p.last(0)[0::2] == j.last(0)[0::2]
        p_entry, j_entry = p.last(0)[1], j.last(0)[1]
        assert p_entry is not None and j_entry is not None and p_entry.op == j_entry.op


# --- bad input ------------------------------------------------------------------------

R0 = RankId("node0", 0, 4242)
GOOD_THREAD = {"pid": 4242, "thread_id": 1, "os_thread_id": 4242, "thread_name": None,
               "frames": [{"name": "main", "filename": "/job/train.py", "line": 3}]}


@pytest.mark.parametrize("text,says", [
    ("", "py-spy printed nothing. Run `py-spy dump --json --pid 4242` on node0"),
    ("  \n", "py-spy printed nothing"),
    ("Error: Failed to get process executable name", "is not JSON"),
    ("{}", "not a list of threads"),
    ("[]", "not a list of threads"),
    (json.dumps([{"pid": 4242, "thread_id": 1}]), "thread 0 has no 'frames'"),
    (json.dumps([{**GOOD_THREAD, "frames": [{"name": "f", "line": 1}]}]),
     "frame 0 has no 'filename'"),
    (json.dumps([{**GOOD_THREAD, "pid": 99}]), "is of pid 99, but rank 0 on node0 is pid 4242"),
])
def test_bad_pyspy_dumps_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(DiagnoseError, match="rank 0 on node0") as err:
        parse_pyspy_dump(text, R0)
    assert says in str(err.value)


def test_no_dumps_or_two_for_one_rank_is_an_error() -> None:
    with pytest.raises(DiagnoseError, match="no py-spy dumps to analyse"):
        analyze_stacks([])
    one = parse_pyspy_dump(json.dumps([GOOD_THREAD]), R0)
    with pytest.raises(DiagnoseError, match="two py-spy dumps for rank 0"):
        analyze_stacks([one, replace(one, rank=RankId("node1", 0, 7))])
    with pytest.raises(DiagnoseError, match="no flight-recorder dumps"):
        analyze_flight_records([])


@pytest.mark.parametrize("data,says", [
    (b"", "is empty"),
    (b"not a dump", "neither torch's pickled nor its JSON"),
    (pickle.dumps(Path("/x")), "refers to pathlib"),
    (pickle.dumps([1, 2]), "is not a dict"),
    (pickle.dumps({"version": "2.10", "entries": []}), "TORCH_FR_BUFFER_SIZE=0"),
    (json.dumps({"pg_status": {"0": {"last_enqueued_collective": "x"}}}).encode(), "pg_status"),
    (pickle.dumps({"pg_status": {"0": {"last_enqueued_collective": 1, "last_started_collective": -1,
                                       "last_completed_collective": 1}},
                   "entries": [{"pg_id": 0}]}), "entry 0 has no 'collective_seq_id'"),
])
def test_bad_flight_recorder_dumps_say_what_is_wrong(data: bytes, says: str) -> None:
    with pytest.raises(DiagnoseError, match="flight-recorder dump of rank 0 on node0") as err:
        parse_flight_record(data, R0)
    assert says in str(err.value)


# --- NCCL, recorded on an H100 (bench/gpu_checks.py) ----------------------------------

@pytest.mark.parametrize("dump", ["fr_request_rank0.pkl", "fr_timeout_rank0.pkl"])
def test_a_nccl_flight_recorder_reads_as_gloos_does(dump: str) -> None:
    """torch 2.11's NCCL recorder, dumped on request by the runner and by torch itself when
    the collective timed out: the same format (2.10) as gloo's, with NCCL's completion
    states; the last collective is still in flight."""
    rec = read_flight_record(DUMPS / "nccl" / dump, R0)
    assert rec.version == "2.10"
    assert [e.profiling_name for e in rec.entries] == [
        "nccl:all_reduce", "nccl:all_reduce", "nccl:all_reduce", "nccl:broadcast",
        "nccl:all_reduce"]
    assert [e.state for e in rec.entries] == ["completed"] * 4 + ["scheduled"]
    seq, entry, state = rec.last(0)
    assert entry is not None and (seq, entry.op, state) == (5, "all_reduce", "scheduled")
    frame = innermost_user_frame(entry.frames)
    assert frame is not None and frame.function == "train_step"


# --- after a collective timeout: the survivors ----------------------------------------

def test_a_survivor_in_its_own_code_is_what_the_timed_out_ranks_waited_for() -> None:
    """Ranks 0, 1 and 3 of the recorded stall timed out and are gone; rank 2 is left,
    outside any collective: alone it is no odd one out, but it is the one they waited for."""
    [rank2] = [s for s in stacks("stall") if s.rank.rank == 2]
    alone = analyze_stacks([rank2])
    assert alone.suspects == []
    named = blame_survivors(alone, "node0's ranks")
    assert [(s.node, s.rank, s.frame) for s in named.suspects] == [("node1", 2, STUCK)]
    assert named.suspects[0].why.endswith("while node0's ranks timed out waiting in a "
                                          "collective")
    assert named.verdict.startswith("rank 2 on node1 held up the others")


def test_survivors_that_wait_in_a_collective_are_not_named() -> None:
    waiting = [s for s in stacks("stall") if s.rank.rank != 2]
    assert blame_survivors(analyze_stacks(waiting[:1]), "node1's ranks").suspects == []
