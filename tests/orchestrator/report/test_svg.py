"""The charts' pieces read as a reader reads them: axes a round step apart with their
numbers written plainly, series thinned and cut at silences, heatmap cells coloured."""

from __future__ import annotations

import math

import pytest

from orchestrator.report import svg

from .browser import Element, elements


def chart(peak: float, span: float) -> list[Element]:
    """A one-series chart rising to PEAK over SPAN seconds, as parsed elements."""
    points = [(1000.0 + span * i / 10, peak * i / 10) for i in range(11)]
    return elements(svg.line_chart("t", "u", [svg.Series("node0", points)], 1000.0,
                                   1000.0 + span))


def labels(drawn: list[Element], axis: str) -> list[str]:
    return [e.text for e in drawn if e.tag == "text" and e.attrs.get("data-axis") == axis]


def test_a_series_peaking_at_0_23_is_read_on_a_grid_of_0_05_steps() -> None:
    drawn = chart(0.23, 60)
    assert labels(drawn, "y") == ["0", "0.05", "0.1", "0.15", "0.2", "0.25"]
    grid = [e for e in drawn if e.tag == "line" and e.has_class("grid")]
    assert len(grid) == 6
    # The peak is drawn where the grid says 0.23 is: 23/25 of the way from 0 to the top.
    ys = sorted(float(e.attrs["y1"]) for e in grid)
    top, bottom = ys[0], ys[-1]
    line = next(e for e in drawn if e.tag == "polyline")
    peak_y = min(float(p.split(",")[1]) for p in line.attrs["points"].split())
    assert peak_y == pytest.approx(bottom - (bottom - top) * 0.23 / 0.25, abs=0.1)


@pytest.mark.parametrize(("peak", "expected"), [
    (1234.0, ["0", "500", "1k", "1.5k"]),
    (1000.0, ["0", "200", "400", "600", "800", "1k"]),
    (38_000.0, ["0", "10k", "20k", "30k", "40k"]),
    (2.3e6, ["0", "500k", "1M", "1.5M", "2M", "2.5M"]),
    (0.00047, ["0", "0.0001", "0.0002", "0.0003", "0.0004", "0.0005"]),
    (0.000093, ["0", "20µ", "40µ", "60µ", "80µ", "100µ"]),
    (7.0, ["0", "2", "4", "6", "8"]),
    (0.0, ["0", "0.2", "0.4", "0.6", "0.8", "1"]),   # nothing above 0 yet
])
def test_the_y_axis_numbers_are_written_plainly(peak: float, expected: list[str]) -> None:
    assert labels(chart(peak, 60), "y") == expected


def test_every_y_axis_has_4_to_6_round_ticks_from_0_to_at_or_above_the_peak() -> None:
    for peak in [m * 10.0 ** k for k in range(-13, 14) for m in (1, 1.01, 1.7, 2, 2.3, 4.9, 5,
                                                                5.01, 7.3, 9.99)]:
        levels, step = svg.ticks(peak)
        assert 4 <= len(levels) <= 6, peak
        assert levels[0] == 0 and levels[-2] < peak <= levels[-1] * (1 + 1e-9), peak
        mantissa = step / 10.0 ** math.floor(math.log10(step) + 1e-9)
        assert round(mantissa, 6) in (1, 2, 5), (peak, step)
        text = [svg.number(v, step) for v in levels]
        assert all("e" not in t and len(t) <= 6 for t in text), text


@pytest.mark.parametrize(("span", "expected"), [
    (40, ["0:00", "0:10", "0:20", "0:30", "0:40"]),
    (37 * 60, ["0:00", "10:00", "20:00", "30:00"]),
    (14 * 60 + 30, ["0:00", "3:00", "6:00", "9:00", "12:00"]),
    (90 * 60, ["0:00:00", "0:15:00", "0:30:00", "0:45:00", "1:00:00", "1:15:00", "1:30:00"]),
    (10 * 3600, ["0:00:00", "2:00:00", "4:00:00", "6:00:00", "8:00:00", "10:00:00"]),
])
def test_the_time_axis_is_ticked_at_round_intervals(span: float, expected: list[str]) -> None:
    drawn = chart(1.0, span)
    assert labels(drawn, "t") == expected
    # Each tick sits where its time is, over the plot's width (from LEFT to RIGHT's edge).
    plot_w = svg.WIDTH - svg.LEFT - svg.RIGHT
    for e in (e for e in drawn if e.attrs.get("data-axis") == "t"):
        seconds = sum(int(part) * 60 ** n for n, part in enumerate(reversed(e.text.split(":"))))
        assert float(e.attrs["x"]) == pytest.approx(svg.LEFT + plot_w * seconds / span, abs=0.1)


def test_every_time_axis_has_4_to_7_ticks_at_a_round_step() -> None:
    for span in [3 * 1.13 ** k for k in range(120)]:   # 3 s to about 70 days
        found = svg.time_ticks(span)
        assert 4 <= len(found) <= 7, span
        step = found[1]
        assert step in svg.TIME_STEPS or step % (7 * 86400) == 0, span
        assert found[-1] <= span < found[-1] + step


def test_a_series_is_thinned_to_the_means_of_equal_spans() -> None:
    points = [(float(t), float(t % 2)) for t in range(10_000)]
    thinned = svg.thin(points, 0.0, 10_000.0, limit=100)
    assert len(thinned) == 100
    assert all(abs(y - 0.5) < 1e-9 for _, y in thinned)
    assert svg.thin(points[:50], 0.0, 50.0, limit=100) == points[:50]


def test_a_line_is_cut_where_its_points_are_far_apart() -> None:
    points = [(0.0, 1.0), (10.0, 1.0), (60.0, 2.0), (70.0, 2.0)]
    assert svg.segments(points, 25.0) == [points[:2], points[2:]]
    assert svg.segments(points, 100.0) == [points]


def test_times_read_as_a_clock_and_cells_go_from_dark_red_to_pale_green() -> None:
    assert svg.heat(0, 10) == "#7f0000" and svg.heat(10, 10) == "#e8f5e9"
    assert svg.heat(5, 10) == "#f4a261" and svg.heat(20, 10) == "#e8f5e9"
    assert svg.clock(3725) == "1:02:05" and svg.clock(65) == "1:05"
    assert svg.clock(900, hours=True) == "0:15:00"
