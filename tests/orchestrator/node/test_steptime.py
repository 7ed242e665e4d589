"""Step times of a plain DDP script, measured by the worker runner (node/steptime.py): the
meter's arithmetic on a clock of the test's own, and two real gloo ranks through the
runner as torchrun starts them, one of them slower."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.node import steptime
from orchestrator.record.progress import Progress, parse_beat

from ..local_node import unused_port
from .test_worker import node_py

JOBS = Path(__file__).parents[1] / "jobs"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ddp_data(iteration: int, comm_ms: float, overlap_ms: float = 0.0) -> dict:
    return {"iteration": iteration, "backward_comm_time": int(comm_ms * 1e6),
            "backward_compute_comm_overlap_time": int(overlap_ms * 1e6)}


def test_a_step_is_its_wall_time_less_the_wait_the_reducer_timed() -> None:
    clock = Clock()
    meter = steptime.StepMeter(clock=clock)
    lines = []
    for i in range(5):   # 0.25 s a step, of which the all-reduce went on 0.1 s after compute
        meter.forward(training=True, synced=True, samples=lambda: 32)
        if i:
            meter.read(ddp_data(i, comm_ms=120, overlap_ms=20))
        lines.append(meter.beat())
        clock.now += 0.25
    assert lines[:4] == [None] * 4   # a beat a second at most
    beat = parse_beat(lines[4] or "")
    assert beat is not None and beat.measured
    assert beat.step_s == pytest.approx(0.15) and beat.wait_s == pytest.approx(0.1)
    assert beat.samples == 32 and beat.step == 4
    assert meter.beat() is None   # a new sum begins


def test_a_peers_uneven_pace_leaves_the_fast_ranks_own_work_as_it_is() -> None:
    """A throttled peer's steps take 0.05 s and 0.35 s in turn; this rank works 0.01 s of
    each and waits the rest. Its timers are read on the long steps only (READ_S): each
    read pairs with that step's own wall time, so the own work stays near 0.01 s (a mean
    wait of the long steps against the mean wall of all would say less than nothing)."""
    clock = Clock()
    meter = steptime.StepMeter(clock=clock, read_s=0.3)
    walls = [0.05, 0.35] * 4
    meter.forward(training=True, synced=True, samples=lambda: 8)
    for i, wall in enumerate(walls):
        clock.now += wall
        meter.forward(training=True, synced=True, samples=lambda: 8)
        if meter.wants_reading():
            meter.read(ddp_data(i + 1, comm_ms=(wall - 0.01) * 1000))
    beat = parse_beat(meter.beat() or "")
    assert beat is not None and beat.step == 8
    assert beat.step_s is not None and beat.wait_s is not None
    assert 0.005 < beat.step_s < 0.02   # (0.0057: the long steps' share applied to all)
    assert beat.step_s + beat.wait_s == pytest.approx(0.2)


def test_the_reducers_figures_are_asked_for_as_often_as_the_reads_need_them() -> None:
    """Steps of 2 ms: the reducer computes its figures every 50th iteration (a read every
    0.2 s wants one every 0.1 s), and the timers are read only at such an iteration."""
    clock = Clock()
    meter = steptime.StepMeter(clock=clock)
    wanted = []
    for _ in range(1200):
        meter.forward(training=True, synced=True, samples=lambda: 8)
        if meter.wants_reading():
            wanted.append(meter.iterations)
            meter.read(ddp_data(meter.iterations - 1, comm_ms=1.0))
        meter.beat()
        clock.now += 0.002
    assert meter.rate == 50
    late = [n for n in wanted if n > 600]   # after the first beat set the rate
    assert late and all((n - 1) % 50 == 0 for n in late), wanted
    assert all(b - a >= 100 for a, b in zip(late, late[1:], strict=False)), late   # 0.2 s


def test_an_evaluation_is_not_a_step_and_the_time_around_it_is_not_counted() -> None:
    clock = Clock()
    meter = steptime.StepMeter(clock=clock)
    meter.forward(training=True, synced=True, samples=lambda: 8)
    clock.now += 0.5
    meter.forward(training=False, synced=True, samples=lambda: None)   # evaluation: 30 s of it
    clock.now += 30
    meter.forward(training=True, synced=True, samples=lambda: 8)
    clock.now += 0.5
    meter.forward(training=True, synced=True, samples=lambda: 8)
    beat = parse_beat(meter.beat() or "")
    assert beat is not None and beat.step == 1 and beat.step_s == pytest.approx(0.5)
    assert beat.wait_s is None   # no timers read: no wait said


def test_gradient_accumulation_spreads_the_wait_over_the_steps_that_do_not_sync() -> None:
    clock = Clock()
    meter = steptime.StepMeter(clock=clock)
    for i in range(9):   # no_sync() for 3 of every 4 forwards; the 4th all-reduces
        meter.forward(training=True, synced=i % 4 == 3, samples=lambda: 4)
        meter.read(ddp_data(i // 4, comm_ms=200))   # the same iteration is read once
        clock.now += 0.2
    beat = parse_beat(meter.beat() or "")
    assert beat is not None and beat.step == 8
    assert beat.wait_s == pytest.approx(0.2 * 2 / 8)   # 2 synced forwards of 8 steps


class Reducing:
    """The part of DDP's surface that the wrapper touches, on the test's clock: a forward
    that trains and all-reduces is an iteration of the reducer, whose figures say it
    waited WAIT_S of each step (a stand-in for the class; real DDP ranks are below)."""

    def __init__(self, wait_s: float = 0.0005) -> None:
        self.training = True
        self.require_backward_grad_sync = True
        self.iteration = 0
        self.rates: list[int] = []
        self.wait_s = wait_s

    def forward(self, x: object) -> object:
        torch = sys.modules["torch"]
        if self.training and torch.is_grad_enabled() and self.require_backward_grad_sync:
            self.iteration += 1
        return x

    def _set_ddp_runtime_logging_sample_rate(self, rate: int) -> None:
        self.rates.append(rate)

    def _get_ddp_logging_data(self) -> dict:
        return ddp_data(self.iteration - 1, comm_ms=self.wait_s * 1000)


@dataclass
class Counting(steptime.StepMeter):
    seen: int = 0   # forwards the meter saw

    def forward(self, training: bool, synced: bool, samples: Callable[[], int | None],
                iterates: bool | None = None, unclocked: int = 0) -> None:
        self.seen += 1
        super().forward(training, synced, samples, iterates, unclocked)


def timed_model(clock: Clock) -> tuple[type[Reducing], Counting, list[str]]:
    pytest.importorskip("torch")

    class Model(Reducing):
        pass

    meter, lines = Counting(clock=clock), list[str]()
    steptime.instrument(Model, meter, out=lines.append)
    return Model, meter, lines


def test_most_forwards_pass_the_meter_by_and_their_steps_still_add_up() -> None:
    """3000 training steps of 2 ms: after the first beat set the rate (50), the meter
    sees about two forwards in 50, and the beats still count every step, at its time,
    with the wait that the reducer's figures (read every 0.2 s) say."""
    clock = Clock()
    model_class, meter, lines = timed_model(clock)
    model = model_class()
    for _ in range(3000):
        model.forward(1)
        clock.now += 0.002
    beats = [b for line in lines if (b := parse_beat(line)) is not None]
    assert meter.rate == 50 and model.rates == [1, 50]
    assert meter.seen < 600 + 2 * 2400 / 50 + 5, meter.seen
    # A beat a second, or at the clocked forward after it (every 0.1 s: 50 steps).
    steps = [b.step or 0 for b in beats]
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)]
    assert steps[0] == 501 and all(500 <= gap <= 550 for gap in gaps), steps
    model.training = False   # an evaluation is clocked: no step lost on the way
    model.forward(1)
    assert meter.steps == 2999   # the last step ends in the evaluation: not counted
    late = beats[1:]
    assert all(b.step_s == pytest.approx(0.0015) and b.wait_s == pytest.approx(0.0005)
               for b in late), late


def test_an_evaluation_amid_unclocked_steps_counts_them_without_their_time() -> None:
    clock = Clock()
    model_class, meter, lines = timed_model(clock)
    model = model_class()
    torch = sys.modules["torch"]
    for i in range(2000):
        if i == 1234:   # 5 s of evaluation: not a step's time
            model.training = False
            with torch.no_grad():
                model.forward(1)
            clock.now += 5
            model.training = True
        model.forward(1)
        clock.now += 0.002
    beats = [b for line in lines if (b := parse_beat(line)) is not None]
    assert model.iteration == 2000 and meter.iterations == 2000
    assert beats and all(b.step_s is not None and b.step_s < 0.002 for b in beats), beats
    model.training = False
    model.forward(1)
    assert meter.steps == 1998   # all but the two steps that ended in an evaluation


def test_the_next_model_is_timed_once_the_first_is_gone() -> None:
    clock = Clock()
    model_class, meter, lines = timed_model(clock)
    for _ in range(2):   # one model per trial, as a search over settings makes them
        model = model_class()
        for _ in range(1000):
            model.forward(1)
            clock.now += 0.002
        del model
        clock.now += 10
    steps = [b.step for line in lines if (b := parse_beat(line)) is not None]
    assert len(steps) == 3 and steps[-1] is not None and steps[-1] > 1000, steps


def test_the_batch_dimension_is_found_in_tensors_tuples_and_dicts() -> None:
    torch = pytest.importorskip("torch")
    x = torch.zeros(16, 3)
    assert steptime.batch_size((x,), {}) == 16
    assert steptime.batch_size(([x, torch.zeros(16)], 7), {}) == 16   # Lightning's (batch, i)
    assert steptime.batch_size((), {"input_ids": torch.zeros(5, 9, dtype=torch.long)}) == 5
    assert steptime.batch_size((torch.tensor(3.0), "text"), {}) is None


def test_a_scripts_own_beats_win_over_the_measured_ones() -> None:
    progress = Progress(now=0.0)
    measured = "##clustertrain beat step_s=0.5 wait_s=0.1 samples=8 step=3 by=ddp"
    own = "##clustertrain beat step_s=0.2 samples=8"
    for t in range(4):
        assert progress.line("n0", 0, measured, float(t))
    for t in range(4, 8):
        assert progress.line("n0", 0, own, float(t))
        assert progress.line("n0", 0, measured, float(t))   # hidden, and not counted
    assert progress.to_json()["nodes"] == {"n0": {"step_s": 0.2, "samples_per_s": 40.0}}


def run_ranks(tmp_path: Path, *args: str) -> list[str]:
    """Two gloo ranks of the plain DDP job through the runner, as torchrun starts them."""
    port = str(unused_port())
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen(
            [sys.executable, str(node_py()), "worker", str(JOBS / "plain_ddp.py"), *args],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


def test_a_plain_ddp_script_gets_step_times_and_the_slow_rank_shows(tmp_path: Path) -> None:
    """Rank 1 sleeps 50 ms a step before its forward: its own work is the longer, and
    rank 0 waits for it in the gradients' all-reduce. Compared by the median of each
    rank's beats, with a margin of half the sleep: on two cores shared with other tests a
    step's own work varies by 10-20 ms (20 ms of sleep and fixed bounds failed there)."""
    pytest.importorskip("torch")
    outs = run_ranks(tmp_path, "--steps", "120", "--width", "64", "--layers", "2",
                     "--slow-rank", "1", "--slow-s", "0.05", "--eval-every", "10")
    beats = [[b for line in out.splitlines() if (b := parse_beat(line)) is not None]
             for out in outs]
    assert all(len(b) >= 2 and all(x.measured for x in b) for b in beats), outs
    assert all(x.samples == 64 and x.step_s and x.wait_s is not None for b in beats for x in b)
    own = [statistics.median(x.step_s or 0.0 for x in b) for b in beats]
    wait = [statistics.median(x.wait_s or 0.0 for x in b) for b in beats]
    assert own[1] > own[0] + 0.025, (own, beats)
    assert wait[0] > wait[1] + 0.025, (wait, beats)
    assert "rank 0 done" in outs[0]   # the script's own lines are as they were


def test_a_fast_ddp_script_gets_every_step_counted_and_its_wait(tmp_path: Path) -> None:
    """Steps of a millisecond or two: most forwards pass the meter by (the cost of
    measuring); the beats still count every step and carry the reducer's wait."""
    pytest.importorskip("torch")
    outs = run_ranks(tmp_path, "--steps", "3000", "--width", "32", "--layers", "1")
    for out in outs:
        beats = [b for line in out.splitlines() if (b := parse_beat(line)) is not None]
        assert len(beats) >= 2, out
        assert all(b.samples == 64 and b.step_s for b in beats), beats
        assert any(b.wait_s is not None for b in beats[1:]), beats
        steps = [b.step or 0 for b in beats]
        assert steps == sorted(steps) and steps[-1] < 3000, steps
        # Beats a second apart count the steps between them: their step times say so.
        for a, b in zip(beats, beats[1:], strict=False):
            assert (b.step or 0) - (a.step or 0) > 0.5 / ((b.step_s or 1) + (b.wait_s or 0)), beats


def test_an_fsdp_script_gets_step_times_of_its_outermost_model(tmp_path: Path) -> None:
    """fully_shard on each layer, then on the whole: one step per training step (not one
    per sharded layer), with the batch's samples; no wait (FSDP times no collectives), so
    the slow rank's peer steps at its pace: both show the slow rank's step time."""
    pytest.importorskip("torch")
    outs = run_ranks(tmp_path, "--fsdp", "--steps", "40", "--width", "64", "--layers", "2",
                     "--slow-rank", "1", "--slow-s", "0.05", "--eval-every", "10")
    beats = [[b for line in out.splitlines() if (b := parse_beat(line)) is not None]
             for out in outs]
    assert all(len(b) >= 2 and all(x.measured for x in b) for b in beats), outs
    assert all("by=fsdp" in line and "wait_s=" not in line for out in outs
               for line in out.splitlines() if "##clustertrain beat" in line), outs
    assert all(x.samples == 64 and x.wait_s is None for b in beats for x in b), beats
    # Every step counted once: the last beat's step number is the steps so far (less the
    # first, which has no predecessor to end it), not a multiple of them.
    assert all(b[-1].step is not None and b[-1].step <= 40 for b in beats), beats
    step = [statistics.median(x.step_s or 0.0 for x in b) for b in beats]
    assert min(step) > 0.05, (step, beats)   # each waits for the slow rank's sleep
    assert "rank 0 done" in outs[0]


def test_a_script_without_ddp_gets_no_beats(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import torch\nprint(torch.nn.Linear(2, 2)(torch.zeros(1, 2)).shape)\n")
    out = subprocess.run([sys.executable, str(node_py()), "worker", str(script)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "##clustertrain beat" not in out.stdout and "torch.Size([1, 2])" in out.stdout
