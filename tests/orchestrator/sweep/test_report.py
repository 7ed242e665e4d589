"""A sweep's report (orchestrator/sweep/report.py) as a reader reads it: the trials best
first, each linked to its run's report; the metric against each parameter, the best trial
red; every trial's loss over its own time. Drawn from recorded trials (no node)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.record.progress import Point
from orchestrator.report import svg
from orchestrator.sweep.record import SweepRecord, TrialState, new_sweep
from orchestrator.sweep.report import REPORT, write_sweep_report
from orchestrator.sweep.sweepfile import Parameter, SweepSpec
from orchestrator.sweep.table import table

from ..report.browser import count_color, elements, screenshot
from ..report.recorded import write_run

SWEEP = SweepSpec("grid", (Parameter("--lr", ("0.1", "0.01")), Parameter("--width", ("4", "8"))),
                  "test_loss")
ENDS = ((0.3, "succeeded", 1.0), (None, "failed", 1.6), (0.1, "succeeded", 0.5),
        (0.2, "succeeded", 0.8))   # each trial's metric, state, and its loss's scale


def recorded_sweep(root: Path) -> SweepRecord:
    """A 2 x 2 grid whose trials ran: t3 best (0.1), then t4, t1; t2 failed. Each trial's
    run is recorded (its own report), its timeline a loss falling from its own height."""
    record = new_sweep(root, root / "sweep.yaml", SWEEP, SWEEP.expand(), 2)
    for trial, (metric, state, scale) in zip(record.trials, ENDS, strict=True):
        trial.run_id = record.trial_run_id(trial)
        trial.tries, trial.state, trial.metric = 1, TrialState(state), metric
        trial.started, trial.ended, trial.nodes = 1000.0, 1090.0, ["node0"]
        trial.why = "rank 0 exited with 1 on node0" if state == "failed" else ""
        run = write_run(root, trial.run_id, ["node0"], 60)
        run.timeline.unlink()
        run.append_timeline(Point(5000.0 + 10 * k, {}, scale * (1 - k / 12)) for k in range(9))
    record.state = "ended"
    record.save()
    return record


def test_the_report_ranks_the_trials_links_their_runs_and_draws_the_metric_and_loss(
        tmp_path: Path) -> None:
    record = recorded_sweep(tmp_path)
    page = write_sweep_report(record)
    assert page == record.path / REPORT
    found = elements(page.read_text())
    rows = [e for e in found if e.tag == "tr" and "data-trial" in e.attrs]
    assert [r.attrs["data-trial"] for r in rows] == ["t3", "t4", "t1", "t2"]
    assert rows[0].has_class("best") and "0.01" in rows[0].text and "0.1" in rows[0].text
    assert "rank 0 exited with 1 on node0" in rows[3].text and "failed" in rows[3].text
    links = {e.text: e.attrs["href"] for e in found if e.tag == "a"}
    assert links["t3"] == f"../{record.sweep_id}.t3/report.html"
    assert all((page.parent / href).resolve().is_file() for href in links.values())
    best = next(e for e in found if e.attrs.get("id") == "best")
    assert "t3" in best.text and "--lr 0.01 --width 4" in best.text and "0.1" in best.text

    charts = [e for e in found if e.tag == "svg" and e.has_class("scatter")]
    assert [c.attrs["aria-label"] for c in charts] == ["test_loss against --lr",
                                                       "test_loss against --width"]
    dots = [e for e in found if e.tag == "circle" and "data-trial" in e.attrs]
    assert sorted(d.attrs["data-trial"] for d in dots) == ["t1", "t1", "t3", "t3", "t4", "t4"]
    assert {d.attrs["data-trial"] for d in dots if d.has_class("best")} == {"t3"}
    lr_ticks = [e.text for e in elements(svg.scatter("x", "--lr", "m", [
        svg.Dot("0.1", 0.3, "t1"), svg.Dot("0.01", 0.1, "t3")])) if e.attrs.get("data-axis") == "x"]
    assert lr_ticks == ["0.01", "0.1"]   # a grid's values in their numeric order

    curves = next(e for e in found if e.tag == "svg" and e.has_class("curves"))
    assert curves.attrs["aria-label"] == "Each trial's training loss, from its start"
    lines = [e for e in found if e.tag == "g" and e.has_class("legend")]
    assert [g.attrs["data-node"] for g in lines] == [
        "t3 0.01 4", "t1 0.1 4", "t2 0.1 8", "t4 0.01 8"]   # the best first, marked
    assert lines[0].attrs.get("data-mark") == "best"
    shot = screenshot(page, "sweep-report")
    assert count_color(shot, svg.MARK_COLOR) > 50   # the best dot and its line, in red


def test_random_draws_are_placed_by_value_on_a_log_axis_and_words_in_their_order() -> None:
    draws = [svg.Dot(f"{10 ** (-4 + k * 0.25):.6g}", 1.0 + k / 10, f"t{k}") for k in range(13)]
    ticks = [e.text for e in elements(svg.scatter("a", "--lr", "loss", draws))
             if e.attrs.get("data-axis") == "x"]
    assert ticks == ["0.0001", "0.001", "0.01", "0.1"]
    words = [svg.Dot("sgd", -0.5, "t1"), svg.Dot("adam", 0.25, "t2")]
    drawn = elements(svg.scatter("b", "--opt", "reward", words))
    assert [e.text for e in drawn if e.attrs.get("data-axis") == "x"] == ["sgd", "adam"]
    levels = [float(e.text) for e in drawn if e.attrs.get("data-axis") == "y"]
    assert levels[0] <= -0.5 and levels[-1] >= 0.25 and 0.0 in levels


def test_a_running_trial_shows_its_loss_so_far(tmp_path: Path) -> None:
    record = new_sweep(tmp_path, tmp_path / "s.yaml", SWEEP, SWEEP.expand(), 2)
    running = record.trials[0]
    running.state, running.started, running.loss = TrialState.RUNNING, 1.0, 0.5213
    assert table(record)[1].endswith("loss 0.5213 so far")
    record.metric = "loss"
    assert table(record)[1].endswith("  0.5213 so far")
    running.state, running.metric = TrialState.SUCCEEDED, 0.49
    assert table(record)[1].endswith("  0.49")
