"""Old run records folded into the user's usage ledger (node/fold.py, node/ledger.py), on
real files of a real user: alice (made here, as root, when missing) folds her own records
in processes of her own, as her run's supervisor does. A run that ended FOLD_AFTER ago
goes, and `usage` gives the same hours after as before; a running run, a recent one and
one with a fresh file are kept; folds at once, or one cut short, count no run twice; a
ledger that is not alice's, or a link, is refused."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.cmd_usage import table
from orchestrator.node import fold, ledger, usage
from orchestrator.node.answers import UsageAnswer
from orchestrator.node.protocol import STATE_STALE

from .conftest import give

H = 3600.0
D = 86400.0
NOW = float(int(time.time()))
MIDNIGHT = ledger.start_of(ledger.day_of(NOW - 40 * D))   # a UTC midnight 40-41 days ago
SINCE = NOW - 60 * D


@pytest.fixture
def share(people: None) -> Iterator[Path]:
    """A share alice reaches (pytest's tmp_path is root's alone): checkpoints/ sticky and
    open to all as the nfs_server role makes it, alice's directory hers."""
    root = Path(tempfile.mkdtemp(prefix="ledger-share-"))
    root.chmod(0o755)
    (root / "checkpoints").mkdir(mode=0o1777)
    (root / "checkpoints").chmod(0o1777)
    runs = root / "checkpoints" / "alice" / ".clustertrain" / "runs"
    runs.mkdir(parents=True)
    give(runs, "alice", root / "checkpoints")
    try:
        yield root
    finally:
        shutil.rmtree(root)


def runs_of(share: Path, user: str = "alice") -> Path:
    return share / "checkpoints" / user / ".clustertrain" / "runs"


def put(share: Path, run: str, parts: dict[str, dict[str, Any]], at: float | None = None,
        files: dict[str, str] | None = None, user: str = "alice") -> Path:
    """Run RUN's node states (and other FILES, by path in its directory) in USER's
    records, USER's; every file and directory of it last written AT (by default: now)."""
    d = runs_of(share, user) / run
    d.mkdir(parents=True, exist_ok=True)
    for node, state in parts.items():
        (d / f"{node}.json").write_text(json.dumps({"node": node, "user": user, **state}))
    for name, text in (files or {}).items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    for path in [*d.rglob("*"), d]:
        give(path, user, share / "checkpoints")
    if at is not None:
        for path in [*sorted(d.rglob("*"), reverse=True), d]:
            os.utime(path, (at, at))
    return d


def alice_does(work: Callable[[], Any]) -> tuple[int, int]:
    """A process of alice's (as her supervisor is) doing WORK: its PID, and the end of a
    pipe its result comes through (result_of)."""
    out, into = os.pipe()
    pid = os.fork()
    if pid == 0:   # pragma: no cover - the child's
        code = 1
        try:
            os.close(out)
            pw = pwd.getpwnam("alice")
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            done = work()
            data = dataclasses.asdict(done) \
                if dataclasses.is_dataclass(done) and not isinstance(done, type) else done
            os.write(into, json.dumps(data).encode())
            code = 0
        except BaseException:  # noqa: BLE001 - said, and the child's status says it
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(into)
    return pid, out


def result_of(pid: int, out: int) -> Any:
    """What alice's process PID did (alice_does), once it has ended."""
    with os.fdopen(out, "rb") as fh:
        said = fh.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "alice's process failed"
    return json.loads(said) if said else None


def as_alice(work: Callable[[], Any]) -> Any:
    """WORK's result, done in a process of alice's."""
    return result_of(*alice_does(work))


def fold_as_alice(share: Path, now: float = NOW) -> dict[str, Any]:
    return as_alice(lambda: fold.fold(str(share), now))


def alices(share: Path, since: float = SINCE, now: float = NOW) -> dict[str, Any]:
    found = usage.usage(str(share), since, now)
    return found["users"].get("alice", {})


def the_ledger(share: Path) -> dict[str, Any]:
    path = share / "checkpoints" / "alice" / ".clustertrain" / ledger.LEDGER
    assert path.stat().st_uid == pwd.getpwnam("alice").pw_uid
    return json.loads(path.read_text())


def ended(start: float, end: float, gpus: int, **more: Any) -> dict[str, Any]:
    return {"state": "ended", "started": start, "ended": end, "time": end + 1, "gpus": gpus,
            **more}


def old_and_new(share: Path) -> None:
    """Alice's records: four runs to fold (one over a UTC midnight, a detached run and its
    second attempt, a node lost mid-run 36 days ago), a run that never started, and five
    to keep (ended 10 days ago; started 40 days ago and running still; a hang dump written
    yesterday; a chain whose second attempt runs; a file of bob's among hers)."""
    m = MIDNIGHT
    put(share, "old1", {"node0": ended(m - 3 * H, m + 5 * H, 4, gpu_idle_s=8 * H),
                        "node1": ended(m - 3 * H, m + 5 * H, 4)}, at=m + 5 * H)
    put(share, "old2", {"node0": ended(m + 2 * D, m + 2 * D + H, 1, reason="peer-lost")},
        at=m + 2 * D + H, files={"recovery/plan.json": "{}"})
    put(share, "old2.r1", {"node0": ended(m + 2 * D + H, m + 2 * D + 3 * H, 2)},
        at=m + 2 * D + 3 * H)
    put(share, "lost", {"node0": {"state": "running", "started": m + 4 * D,
                                  "time": m + 4 * D + 6 * H, "gpus": 8}}, at=m + 4 * D + 6 * H)
    put(share, "never", {}, at=m, files={"recovery/plan.json": "{}"})
    put(share, "recent", {"node0": ended(NOW - 10 * D - H, NOW - 10 * D, 1)}, at=NOW - 10 * D)
    put(share, "running", {"node0": {"state": "running", "started": NOW - 40 * D,
                                     "time": NOW - 30, "gpus": 2}},
        at=m)   # its files' times aside (a share's clock behind): its state keeps it
    put(share, "dumped", {"node0": ended(m, m + H, 1)}, at=m + H,
        files={"hang/node0.json": "{}"})
    os.utime(runs_of(share) / "dumped" / "hang" / "node0.json", (NOW - D,) * 2)   # yesterday
    put(share, "chain", {"node0": ended(m, m + H, 1)}, at=m + H)
    put(share, "chain.r1", {"node0": {"state": "running", "started": NOW - 39 * D,
                                      "time": NOW - 30, "gpus": 1}}, at=m + H)
    bobs = put(share, "foreign", {"node0": ended(m, m + H, 1)}, at=m + H)
    os.lchown(bobs / "node0.json", pwd.getpwnam("bob").pw_uid, -1)


FOLDED = {"old1", "old2", "old2.r1", "lost", "never"}
KEPT = {"recent", "running", "dumped", "chain", "chain.r1", "foreign"}


def test_old_ended_runs_are_folded_and_usage_gives_the_same_hours(share: Path) -> None:
    old_and_new(share)
    before = alices(share)
    done = fold_as_alice(share)
    assert sorted(done["counted"]) == sorted(FOLDED), done
    assert {p.name for p in runs_of(share).iterdir()} == KEPT   # the folded ones are gone
    after = usage.usage(str(share), SINCE, NOW)
    assert after["users"]["alice"] == before
    # old1 16 node-hours (64 GPU-hours, 8 idle), old2 1, old2.r1 2 (4), lost 6 (48)
    assert after["ledger"]["alice"] == {
        "runs": 4, "node_hours": 25.0, "gpu_hours": 117.0, "idle_gpu_hours": 8.0,
        "first_day": ledger.day_of(MIDNIGHT - D), "last_day": ledger.day_of(MIDNIGHT + 4 * D)}
    book = the_ledger(share)
    assert book["pending"] == [] and book["generation"] >= 1
    assert book["days"][ledger.day_of(MIDNIGHT - D)] == {      # old1's 3 hours before midnight
        "runs": 1, "node_s": 6 * H, "gpu_s": 24 * H, "idle_gpu_s": 3 * H}
    # Its node0 idled 8 of its 32 GPU-hours, a quarter of each hour: 5 after midnight.
    assert book["days"][ledger.day_of(MIDNIGHT)] == {
        "runs": 0, "node_s": 10 * H, "gpu_s": 40 * H, "idle_gpu_s": 5 * H}
    again = fold_as_alice(share)
    assert again == {"counted": [], "removed": [], "stopped": None, "skipped": None}
    assert the_ledger(share) == book   # nothing new: not written again
    assert usage.usage(str(share), SINCE, NOW)["users"]["alice"] == before


def test_a_window_from_a_utc_midnight_counts_the_same_hours_by_the_day(share: Path) -> None:
    """A window that starts at a UTC midnight cuts a folded run where its days do: the
    same hours after the fold; the run itself counts on the day it started, before the
    window, and no longer in RUNS (day granularity, as `usage --help` says)."""
    old_and_new(share)
    before = alices(share, since=MIDNIGHT)
    fold_as_alice(share)
    after = alices(share, since=MIDNIGHT)
    assert {k: after[k] for k in ("node_hours", "gpu_hours", "idle_gpu_hours")} == \
        {k: before[k] for k in ("node_hours", "gpu_hours", "idle_gpu_hours")}
    assert after["runs"] == before["runs"] - 1   # old1, started the day before


def test_running_recent_and_freshly_written_runs_are_kept_whole(share: Path) -> None:
    old_and_new(share)
    kept = {run: sorted(p.relative_to(runs_of(share)).as_posix()
                        for p in (runs_of(share) / run).rglob("*")) for run in KEPT}
    done = fold_as_alice(share)
    assert not KEPT & set(done["counted"])
    assert {run: sorted(p.relative_to(runs_of(share)).as_posix()
                        for p in (runs_of(share) / run).rglob("*")) for run in KEPT} == kept
    found = usage.usage(str(share), SINCE, NOW)
    runs = {r["run"]: r for r in found["runs"]}
    assert runs["running"]["end"] is None and runs["chain.r1"]["end"] is None
    assert set(runs) == KEPT - {"foreign"}   # bob's file in it is still said, not counted
    assert [r["path"] for r in found["refused"]] == [
        str(runs_of(share) / "foreign" / "node0.json")]


def test_a_node_silent_for_less_than_state_stale_is_running(share: Path) -> None:
    """The rule `usage` uses for a part that never wrote its end: ended at its last
    writing once that is STATE_STALE old; a part written since is running, never folded."""
    put(share, "quiet", {"node0": {"state": "running", "started": NOW - 50 * D,
                                   "time": NOW - STATE_STALE / 2, "gpus": 1}}, at=NOW - 40 * D)
    assert fold_as_alice(share)["counted"] == []
    assert (runs_of(share) / "quiet" / "node0.json").exists()


def test_folds_at_once_count_every_run_once(share: Path) -> None:
    """Four of alice's runs start at once on four nodes (four processes here), with more
    old runs than one writing of the ledger counts: one fold folds them, the others find
    the lock taken; every run is counted once, and usage is what it was."""
    n = fold.BATCH + 50
    for i in range(n):
        start = MIDNIGHT - i * H   # the oldest ten days before: all in the window
        put(share, f"r{i:04d}", {"node0": ended(start, start + H, 1)}, at=start + H)
    before = alices(share)
    assert before["runs"] == n and before["node_hours"] == n
    go_out, go_in = os.pipe()

    def at_once() -> fold.Folded:
        os.read(go_out, 1)
        return fold.fold(str(share), NOW)

    folds = [alice_does(at_once) for _ in range(4)]
    os.write(go_in, b"go" * 2)
    results = [result_of(pid, out) for pid, out in folds]
    os.close(go_out)
    os.close(go_in)
    counted = [run for r in results for run in r["counted"]]
    assert sorted(counted) == sorted(f"r{i:04d}" for i in range(n))   # each once
    assert list(runs_of(share).iterdir()) == []
    assert sum(day["runs"] for day in the_ledger(share)["days"].values()) == n
    assert alices(share) == before


def test_a_fold_cut_short_after_the_ledger_counts_no_run_twice(share: Path) -> None:
    """Alice's node dies right after the ledger is written (its directories not removed,
    its lock left): `usage` skips the runs the ledger names pending; the next fold, once
    the lock is stale, removes them without counting them again."""
    old_and_new(share)
    before = alices(share)

    def cut_short() -> None:
        fold._remove = lambda runs, book, done: os._exit(0) if book.pending else False
        fold.fold(str(share), NOW)

    as_alice(cut_short)
    book = the_ledger(share)
    assert sorted(book["pending"]) == sorted(FOLDED)
    assert {p.name for p in runs_of(share).iterdir()} == FOLDED | KEPT   # still there
    assert alices(share) == before   # counted once: by the ledger
    lock = share / "checkpoints" / "alice" / ".clustertrain" / ledger.LOCK
    assert lock.is_dir()   # its holder died with it
    assert fold_as_alice(share)["skipped"] == "another fold holds the ledger's lock"
    os.utime(lock, (NOW - ledger.LOCK_STALE - 60,) * 2)
    done = fold_as_alice(share)
    assert done["counted"] == [] and sorted(done["removed"]) == sorted(FOLDED)
    assert {p.name for p in runs_of(share).iterdir()} == KEPT
    after = the_ledger(share)
    assert after["days"] == book["days"] and after["pending"] == []
    assert not lock.exists()
    assert alices(share) == before


def test_a_fold_cut_short_after_the_removal_counts_no_run_twice(share: Path) -> None:
    """Cut short after the directories went, before the ledger said so: the next fold
    drops them from the pending runs, and counts nothing again."""
    old_and_new(share)
    before = alices(share)
    real = fold._remove

    def cut_short() -> None:
        def remove_then_die(runs: str, book: ledger.Ledger, done: fold.Folded) -> bool:
            real(runs, book, done)
            if done.removed:
                os._exit(0)
            return False
        fold._remove = remove_then_die
        fold.fold(str(share), NOW)

    as_alice(cut_short)
    assert sorted(the_ledger(share)["pending"]) == sorted(FOLDED)   # gone, said pending
    assert {p.name for p in runs_of(share).iterdir()} == KEPT
    assert alices(share) == before
    lock = share / "checkpoints" / "alice" / ".clustertrain" / ledger.LOCK
    os.utime(lock, (NOW - ledger.LOCK_STALE - 60,) * 2)
    done = fold_as_alice(share)
    assert done["counted"] == [] and sorted(done["removed"]) == sorted(FOLDED)
    assert the_ledger(share)["pending"] == []
    assert alices(share) == before


def test_a_usage_that_a_fold_goes_by_reads_again(share: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A fold between `usage`'s reading of the ledger and of the records (the runs it
    folded gone from both as read): `usage` finds the ledger's generation changed, and
    reads both again."""
    old_and_new(share)
    before = alices(share)
    real, folds = usage._runs, list[dict[str, Any]]()

    def fold_first(*args: Any) -> None:
        if not folds:
            folds.append(fold_as_alice(share))
        real(*args)

    monkeypatch.setattr(usage, "_runs", fold_first)
    assert alices(share) == before
    assert sorted(folds[0]["counted"]) == sorted(FOLDED)


@pytest.mark.parametrize("planted", ["bob's", "link", "not a ledger"])
def test_a_ledger_not_alices_or_a_link_is_refused_and_left(share: Path, planted: str) -> None:
    """A ledger in alice's directory that bob owns counts nothing and is said with its
    owner; a link is not followed; one that is not a ledger is not counted, and a fold
    rewrites none of them (nor removes a run it would have counted)."""
    old_and_new(share)
    mine = share / "checkpoints" / "alice" / ".clustertrain"
    path = mine / ledger.LEDGER
    forged = {"version": 1, "generation": 1, "pending": [],
              "days": {ledger.day_of(NOW - 45 * D): {"runs": 9, "node_s": 900 * H,
                                                     "gpu_s": 7200 * H, "idle_gpu_s": 0}}}
    alone = usage.usage(str(share), SINCE, NOW)["users"]
    if planted == "link":
        elsewhere = share / "elsewhere.json"
        elsewhere.write_text(json.dumps(forged))
        give(elsewhere, "alice", share)
        path.symlink_to(elsewhere)
        os.lchown(path, pwd.getpwnam("alice").pw_uid, -1)
    else:
        path.write_text(json.dumps(forged) if planted == "bob's" else '{"days": 3}')
        os.lchown(path, pwd.getpwnam("bob" if planted == "bob's" else "alice").pw_uid, -1)
    before = usage.usage(str(share), SINCE, NOW)
    assert before["ledger"] == {} and before["users"] == alone   # none of the 900 forged
    [refused] = [r for r in before["refused"] if r["path"] == str(path)]
    assert refused["why"] == {
        "bob's": "its owner is bob, not alice, whose directory it lies in: not counted",
        "link": "a symbolic link: not followed",
        "not a ledger": f"not a usage ledger (its version is not {ledger.VERSION}): not "
                        "counted"}[planted]
    assert refused["owner"] == {"bob's": "bob", "link": "?", "not a ledger": "alice"}[planted]
    text = path.read_text() if planted != "link" else os.readlink(path)
    done = fold_as_alice(share)
    assert done["counted"] == [] and done["stopped"].startswith(f"the ledger {path} is left")
    assert (path.read_text() if planted != "link" else os.readlink(path)) == text
    assert FOLDED <= {p.name for p in runs_of(share).iterdir()}
    assert usage.usage(str(share), SINCE, NOW)["users"] == before["users"]


def test_the_table_says_what_the_ledger_counted(share: Path) -> None:
    old_and_new(share)
    fold_as_alice(share)
    lines = table(UsageAnswer.from_json(usage.usage(str(share), SINCE, NOW)), runs=True)
    assert (f"folded: alice's runs of {ledger.day_of(MIDNIGHT - D)} to "
            f"{ledger.day_of(MIDNIGHT + 4 * D)} (UTC days; 4 started then) are counted by "
            "the day from the usage ledger: their records were folded 30 days after they "
            "ended") in lines, lines
    assert not any(line.startswith("old1") for line in lines)   # no line of its own


def test_only_the_users_own_runs_state_directory_is_folded(share: Path) -> None:
    """A supervisor folds the records of its own user's directory alone."""
    old_and_new(share)
    state_dir = str(runs_of(share) / "new-run")
    assert fold.fold_for(state_dir, NOW).skipped == \
        f"{state_dir} is not a run's state directory of root"   # root, for alice's
    assert as_alice(lambda: fold.fold_for(state_dir, NOW))["counted"]


def test_a_stale_lock_is_broken_and_a_fresh_one_kept(share: Path) -> None:
    where = str(share / "checkpoints" / "alice" / ".clustertrain")
    first, second = ledger.Lock(where), ledger.Lock(where)
    assert first.take() and first.held()
    assert not second.take()
    os.utime(first.path, (NOW - ledger.LOCK_STALE - 1,) * 2)
    assert second.take() and second.held()
    assert not first.held()   # broken: its holder writes nothing more
    first.release()
    assert second.held()
    second.release()
    assert not os.path.exists(second.path)


def test_the_ledgers_days_in_a_window_are_those_whose_middle_is_in_it() -> None:
    book = ledger.Ledger.from_json({"version": 1, "generation": 3, "pending": [], "days": {
        "2026-01-01": {"runs": 1, "node_s": 10, "gpu_s": 20, "idle_gpu_s": 5},
        "2026-01-02": {"runs": 2, "node_s": 30, "gpu_s": 40, "idle_gpu_s": 0}}})
    jan2 = ledger.start_of("2026-01-02")
    # --since 2026-01-02 in local time, anywhere from UTC-11 to UTC+11: that day on.
    for offset in (-11 * H, 0, 11 * H):
        total, days = book.window(jan2 + offset, jan2 + 10 * D)
        assert days == ["2026-01-02"] and total == ledger.Day(2, 30, 40, 0)
    assert book.window(jan2 - D, jan2 + D)[1] == ["2026-01-01", "2026-01-02"]
    for bad in ({"version": 1, "generation": 1, "pending": [], "days": {"x": {}}},
                {"version": 1, "generation": 1, "pending": [3], "days": {}},
                {"version": 1, "generation": 1, "pending": [], "days": {"2026-01-01": {
                    "runs": 1, "node_s": -1, "gpu_s": 0, "idle_gpu_s": 0}}},
                {"version": 2}):
        with pytest.raises(ValueError):
            ledger.Ledger.from_json(bad)
