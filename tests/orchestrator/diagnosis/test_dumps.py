"""`diagnose`: the node-side dump (the node package's `dump` verb, with the real py-spy on
real processes of this machine) and the reading of every node's dumps into a report."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.diagnosis.dumps import NodeDumps, analyse
from orchestrator.diagnosis.hang import RankId, parse_pyspy_dump
from orchestrator.node import terminate as node_stop
from orchestrator.node.answers import DumpAnswer, RankDump

DUMPS = Path(__file__).parents[1] / "hang_dumps"
PY_SPY = shutil.which("py-spy", path=os.path.dirname(sys.executable))

# A stand-in for torchrun: records its group (as the supervisor does), starts two
# "workers" with RANK set, each waiting in a function of its own; worker 1 also has a
# child of its own with RANK inherited (a data-loader worker), which is not a rank.
TORCHRUN = """
import os, subprocess, sys, time
job = sys.argv[1]
worker = '''
import os, subprocess, sys, time
def waiting_in_rank_{r}():
    time.sleep(300)
if os.environ["RANK"] == "1":
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(os.path.join(sys.argv[1], "ready-" + os.environ["RANK"]), "w").close()
waiting_in_rank_{r}()
'''
for r in (0, 1):
    subprocess.Popen([sys.executable, "-c", worker.replace("{r}", str(r)), job],
                     env={**os.environ, "RANK": str(r)}, start_new_session=True)
open(os.path.join(job, "pgid"), "w").write(str(os.getpid()))
time.sleep(300)
"""


@pytest.fixture
def fake_run(tmp_path: Path):
    job = tmp_path / "jobs" / "run-d"
    job.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", TORCHRUN, str(job)], start_new_session=True,
                            env={**os.environ, "CLUSTERTRAIN_RUN_ID": "run-d"})
    deadline = time.monotonic() + 20
    while not all((job / f"ready-{r}").exists() for r in (0, 1)) or not (job / "pgid").exists():
        assert time.monotonic() < deadline, "the fake workers did not start"
        time.sleep(0.05)
    yield job
    for pid in node_stop.Tree(proc.pid).members():
        os.kill(pid, 9)
    proc.wait()


def node_dump(job: Path, py_spy: str) -> list[RankDump]:
    """The dump verb as the node runs it: HOME/<jobs dir>/<run id>; its answer's ranks."""
    out = subprocess.run([sys.executable, "-m", "orchestrator.node", "dump", job.parent.name,
                          job.name, py_spy], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HOME": str(job.parent.parent)})
    assert out.returncode == 0, out.stderr
    return DumpAnswer.from_json(json.loads(out.stdout.strip().splitlines()[-1])).ranks


def test_the_node_dumps_every_worker_of_the_run_and_no_other_process(fake_run: Path) -> None:
    assert PY_SPY is not None, "py-spy is a test dependency (pyproject.toml): make test-venv"
    entries = node_dump(fake_run, PY_SPY)
    assert [e.rank for e in entries] == [0, 1], entries  # not the data-loader child
    for e in entries:
        assert e.dump is not None
        stacks = parse_pyspy_dump(e.dump, RankId("n0", e.rank, e.pid))
        main = stacks.threads[0]
        assert any(f.function == f"waiting_in_rank_{e.rank}" for f in main.frames)


def test_a_missing_py_spy_is_said_for_each_rank(fake_run: Path, tmp_path: Path) -> None:
    entries = node_dump(fake_run, str(tmp_path / "no" / "py-spy"))
    assert [e.rank for e in entries] == [0, 1]
    assert all("No such file" in (e.error or "") and e.dump is None for e in entries)
    diagnosis = analyse([[NodeDumps("node0", entries)]], tmp_path / "hang")
    assert diagnosis.analysis is None
    report = diagnosis.report()
    assert "No rank could be dumped" in report and "provision the nodes again" in report


def stall_round(rank2_from: int = 2) -> list[NodeDumps]:
    """The recorded dumps of a real hung 4-rank job (rank 2 stuck before an all_reduce,
    the others in it), as two nodes' dump verbs return them; rank 2's dump may be another
    rank's (rank 2 has moved on)."""
    ranks = json.loads((DUMPS / "stall" / "ranks.json").read_text())
    by_node: dict[str, list[RankDump]] = {}
    for r in ranks:
        source = ranks[rank2_from] if r["rank"] == 2 else r
        dump = (DUMPS / "stall" / f"rank{source['rank']}.json").read_text()
        dump = dump.replace(f'"pid": {source["pid"]}', f'"pid": {r["pid"]}')
        by_node.setdefault(r["node"], []).append(RankDump(r["rank"], r["pid"], dump=dump))
    return [NodeDumps(n, e) for n, e in by_node.items()]


def test_dumps_of_every_node_are_kept_read_and_the_suspect_named(tmp_path: Path) -> None:
    dumps = stall_round()
    dumps.append(NodeDumps("node2", error="ssh: connect to host node2: No route to host"))
    diagnosis = analyse([dumps, stall_round()], tmp_path / "hang")
    data = diagnosis.to_json()
    assert [(s["node"], s["rank"]) for s in data["suspects"]] == [("node1", 2)]
    assert data["not_dumped"] == ["node2: ssh: connect to host node2: No route to host"]
    kept = sorted(p.name for p in (tmp_path / "hang").iterdir())
    assert kept == ["analysis.json", "node0-rank0.json", "node0-rank0.sample2.json",
                    "node0-rank1.json", "node0-rank1.sample2.json", "node1-rank2.json",
                    "node1-rank2.sample2.json", "node1-rank3.json", "node1-rank3.sample2.json",
                    "report.txt"]
    report = (tmp_path / "hang" / "report.txt").read_text()
    assert "suspect: rank 2 on node1 is in stuck_in_data_loading" in report
    assert "not dumped: node2: ssh: connect to host node2" in report


def test_a_rank_that_moved_between_samples_is_not_named(tmp_path: Path) -> None:
    """Sampled while healthy, a rank may be caught outside a collective that the others
    are in: the next sample finds it elsewhere, so nobody is named."""
    diagnosis = analyse([stall_round(), stall_round(rank2_from=0)], tmp_path / "d")
    assert diagnosis.analysis is not None and diagnosis.analysis.suspects == []
    assert diagnosis.analysis.verdict == ("no suspect: rank 2 moved between the 2 samples, "
                                          "so the run makes progress")


# --- flight records beside the stacks -------------------------------------------------

def as_sent(path: Path) -> str:
    """A flight-recorder dump as the supervisor's dump verb sends it."""
    return base64.b64encode(zlib.compress(path.read_bytes())).decode()


def with_records(dumps: list[NodeDumps], case: str) -> list[NodeDumps]:
    for node in dumps:
        node.ranks = [replace(entry, fr=as_sent(DUMPS / case / f"fr_rank{entry.rank}.pkl"))
                      for entry in node.ranks]
    return dumps


def test_flight_records_are_kept_and_read_beside_the_stacks(tmp_path: Path) -> None:
    diagnosis = analyse([with_records(stall_round(), "stall")], tmp_path / "hang")
    kept = sorted(p.name for p in (tmp_path / "hang").glob("*.fr.pkl"))
    assert kept == ["node0-rank0.fr.pkl", "node0-rank1.fr.pkl", "node1-rank2.fr.pkl",
                    "node1-rank3.fr.pkl"]
    data = diagnosis.to_json()
    assert data["source"] == "py-spy stacks"
    assert [(s["node"], s["rank"]) for s in data["flight_recorder"]["suspects"]] == [
        ("node1", 2)]
    report = diagnosis.report()
    assert "Hang analysis from flight recorder" in report
    assert "#3 all_reduce" in report  # the sequence number the others wait at


def test_the_flight_recorder_names_the_rank_when_the_stacks_agree(tmp_path: Path) -> None:
    """With NCCL every rank's Python may have gone past the collective and wait at the
    same line, so the stacks name nobody; the recorders still show the rank behind.
    Stacks of the recorded `healthy` hang (every rank in one place) with the recorders
    of the recorded `stall` hang stand for that case."""
    healthy = {r["rank"]: r["pid"]
               for r in json.loads((DUMPS / "healthy" / "ranks.json").read_text())}
    stacks = stall_round()
    for node in stacks:
        node.ranks = [replace(entry, dump=(DUMPS / "healthy" / f"rank{entry.rank}.json")
                              .read_text().replace(f'"pid": {healthy[entry.rank]}',
                                                   f'"pid": {entry.pid}'))
                      for entry in node.ranks]
    diagnosis = analyse([with_records(stacks, "stall")], tmp_path / "hang")
    assert diagnosis.stacks is not None and diagnosis.stacks.suspects == []
    data = diagnosis.to_json()
    assert data["source"] == "flight recorder"
    assert [(s["node"], s["rank"]) for s in data["suspects"]] == [("node1", 2)]


def test_a_rank_without_a_flight_recorder_is_said_and_the_stacks_still_read(
        tmp_path: Path) -> None:
    dumps = stall_round()
    for node in dumps:
        node.ranks = [replace(entry, fr_error="the worker serves no flight recorder (No such "
                              "file or directory)") for entry in node.ranks]
    diagnosis = analyse([dumps], tmp_path / "hang")
    assert diagnosis.flight is None and diagnosis.analysis is not None
    assert [(s.node, s.rank) for s in diagnosis.analysis.suspects] == [("node1", 2)]
    assert ("not dumped: rank 2 on node1: flight recorder: the worker serves no flight "
            "recorder") in diagnosis.report()


def test_a_recorded_nccl_rank_shows_the_collective_its_stack_has_left(tmp_path: Path) -> None:
    """Recorded on an H100 (bench/gpu_checks.py): a NCCL all_reduce enqueued behind a
    long GPU kernel, its rank's Python already waiting further on. py-spy finds the rank
    outside any collective; its recorder holds the collective, its number and its caller."""
    nccl = DUMPS / "nccl"
    pid = json.loads((nccl / "rank0.json").read_text())[0]["pid"]
    dumps = [NodeDumps("gpu0", [RankDump(0, pid, dump=(nccl / "rank0.json").read_text(),
                                         fr=as_sent(nccl / "fr_request_rank0.pkl"))])]
    diagnosis = analyse([dumps], tmp_path / "d")
    assert diagnosis.stacks is not None and diagnosis.flight is not None
    assert "outside any collective" in diagnosis.stacks.report()
    assert ("rank 0 (gpu0: 0): #5 all_reduce (scheduled) in process group 0, called from "
            "train_step (job.py:28)") in diagnosis.flight.report()
