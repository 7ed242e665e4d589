"""doctor's node side (orchestrator/node/doctor.py): the schedule of pairs, the link
server and client on real sockets, and the whole job under a real torchrun with two
"nodes" on this machine (127.0.0.1 and 127.0.0.2)."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.node import doctor as job


@pytest.mark.parametrize("n", range(1, 10))
def test_every_pair_is_measured_once_and_no_node_is_in_two_pairs_at_a_time(n: int) -> None:
    rounds = job.pair_rounds(n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))
    for r in rounds:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))
    assert len(rounds) == (0 if n < 2 else n - 1 if n % 2 == 0 else n)


def test_a_link_is_measured_both_ways_with_its_round_trip() -> None:
    listener, port = job.serve("127.0.0.1")
    try:
        got = job.measure_link("127.0.0.1", port, seconds=0.2, pings=20)
    finally:
        listener.close()
    # Loopback moves well over a Gbit/s either way; a byte's round trip is under 50 ms.
    assert got["out_gbit_s"] > 1 and got["in_gbit_s"] > 1
    assert 0 < got["rtt_ms"] < 50


def test_a_links_rate_is_its_best_window_not_a_moment_the_cpus_were_busy() -> None:
    """A receiver that sees 0.2 s at full rate and then a stretch at a tenth of it (the
    node's CPUs served another job meanwhile) reports the full rate."""
    a, b = socket.socketpair()
    chunk = b"\0" * 65536

    def send() -> None:
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:        # full rate
            a.sendall(chunk)
        for _ in range(6):                      # then slow: a chunk every 0.1 s
            a.sendall(chunk)
            time.sleep(0.1)
        a.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send)
    sender.start()
    total, seconds = job._receive_all(b, window=0.2)
    sender.join()
    a.close()
    b.close()
    slow = 65536 / 0.1
    assert 0.2 <= seconds < 0.45 and total / seconds > 20 * slow, (total, seconds)


def test_a_link_with_nothing_listening_is_an_error_not_a_crash() -> None:
    with socket.socket() as s:   # a port that was free a moment ago: refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = job.measure_link("127.0.0.1", port, seconds=0.2, pings=5)
    assert got == {"error": f"connecting to 127.0.0.1:{port}: [Errno 111] Connection refused"}


@pytest.mark.slow
def test_the_job_under_torchrun_measures_links_compute_and_all_reduce(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "CLUSTERTRAIN_BACKEND": "gloo", "OMP_NUM_THREADS": "1"}
    argv = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
            "--master-port", "29641", job.__file__, "--addresses", "127.0.0.1,127.0.0.2",
            "--link-seconds", "0.2", "--pings", "5", "--compute-seconds", "0.2",
            "--allreduce-mb", "1", "--allreduce-iters", "2"]
    procs = [subprocess.Popen([str(torchrun), "--node-rank", str(i), *argv], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    out = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], out
    line = next(x for x in out[0].splitlines() if job.RESULT_MARK in x)
    result = json.loads(line.split(job.RESULT_MARK, 1)[1])
    assert {(lk["src"], lk["dst"]) for lk in result["links"]} == {(0, 1), (1, 0)}
    assert all(lk["gbit_s"] > 0 and lk["latency_ms"] > 0 for lk in result["links"])
    assert sorted(r["node"] for r in result["ranks"]) == [0, 1]
    assert all(r["gflops"] > 0 for r in result["ranks"])
    ar = result["allreduce"]
    assert ar["ranks"] == 2 and ar["backend"] == "gloo" and ar["bytes"] == 1_000_000
    assert ar["busbw_gbyte_s"] == pytest.approx(ar["algbw_gbyte_s"])  # 2(n-1)/n = 1
    assert result["gpus"] == {}   # no nvidia-smi here


def test_a_moment_of_someone_elses_work_does_not_lower_the_compute_rate() -> None:
    """GFLOP/s is the best window's: steps slowed fivefold during the first three of five
    windows (another process on the cores for a while) leave the rate that of the last
    two, where the mean over the whole time (one window) falls by about half."""

    def slowed_at_first():  # noqa: ANN202 - a step, slow for its first 0.9 s
        started = time.perf_counter()
        return lambda: time.sleep(0.01 if time.perf_counter() - started > 0.9 else 0.05)

    rate = job.best_rate(slowed_at_first(), seconds=1.5, windows=5)
    assert 75 < rate <= 100, rate   # ~100 steps/s outside the slow moment
    mean = job.best_rate(slowed_at_first(), seconds=1.5, windows=1)
    assert mean < 70, mean           # one window: the whole time's mean, the old reading


def test_a_slow_node_is_slow_in_every_window() -> None:
    rate = job.best_rate(lambda: time.sleep(0.04), seconds=0.5, windows=5)
    assert rate < 26, rate


def test_far_below_is_judged_against_the_others_median() -> None:
    assert job.far_below([80.0, 82.0, 30.0]) == [2]
    assert job.far_below([80.0, 82.0, 45.0]) == []
    assert job.far_below([30.0]) == []     # alone: nobody to be slower than


class Ranks:
    """Three ranks' readings, round by round, as this rank (rank 2) sees them gathered."""

    def __init__(self, *rounds: tuple[float, float, float]) -> None:
        self.rounds, self.measured = list(rounds), 0
        self.said: list[list[int]] = []

    def measure(self) -> float:
        self.measured += 1
        return self.rounds[self.measured - 1][2]

    def gather(self, mine: float) -> list[float]:
        others = [max(r[i] for r in self.rounds[:self.measured]) for i in (0, 1)]
        return [*others, mine]


def test_a_rank_slowed_for_a_moment_measures_again_and_keeps_its_best() -> None:
    ranks = Ranks((83.0, 80.0, 30.0), (81.0, 84.0, 79.0))
    rate = job.steady_rate(ranks.measure, ranks.gather, again=ranks.said.append)
    assert rate == 79.0 and ranks.measured == 2 and ranks.said == [[2]]


def test_a_slow_rank_reads_slow_every_round_and_stays_slow() -> None:
    ranks = Ranks(*[(83.0, 80.0, 20.0)] * 3)
    rate = job.steady_rate(ranks.measure, ranks.gather, again=ranks.said.append)
    assert rate == 20.0 and ranks.measured == job.COMPUTE_ROUNDS == 3
    assert ranks.said == [[2], [2]]


def test_nobody_slow_is_measured_once() -> None:
    ranks = Ranks((83.0, 80.0, 70.0))
    assert job.steady_rate(ranks.measure, ranks.gather, again=ranks.said.append) == 70.0
    assert ranks.measured == 1 and ranks.said == []


def test_a_links_best_reading_is_kept() -> None:
    """A link measured again (it read slow): its best reading counts, and a reading that
    failed never replaces one that did not."""
    links: list[dict] = []
    job.keep_best(links, {"src": 0, "dst": 1, "gbit_s": 13.1})
    job.keep_best(links, {"src": 1, "dst": 0, "gbit_s": 27.0})
    job.keep_best(links, {"src": 0, "dst": 1, "gbit_s": 26.5})
    job.keep_best(links, {"src": 1, "dst": 0, "gbit_s": 0.0, "error": "timed out"})
    assert links == [{"src": 0, "dst": 1, "gbit_s": 26.5}, {"src": 1, "dst": 0, "gbit_s": 27.0}]
    job.keep_best(links, {"src": 0, "dst": 2, "gbit_s": 0.0, "error": "refused"})
    job.keep_best(links, {"src": 0, "dst": 2, "gbit_s": 3.0})
    assert links[2] == {"src": 0, "dst": 2, "gbit_s": 3.0}
