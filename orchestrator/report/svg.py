"""Charts as inline SVG, drawn here so that a report is one file that needs nothing else
(no script, no font, no network): a line chart over the run's time and a heatmap (pure).

Every element a reader looks for carries a class and data attributes (a series its node,
a marked series its mark, a heatmap cell its row and column), so that a test reads the
rendered page as a reader reads the picture."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

MAX_POINTS = 600      # a series is drawn with at most this many points (means of buckets)
DOTS = 30             # a series of this many points or fewer has each drawn as a dot too
WIDTH, HEIGHT = 1060, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 250, 30, 34   # the plot's margins: axes left, legend right
MARK_COLOR = "#d62728"   # a straggler's series, a suspect's row, a failure's line
OK_COLOR = "#2ca02c"     # training again after a recovery
# Node colours: blues, greens, purples and greys, never the MARK_COLOR's red.
PALETTE = ("#1f77b4", "#17becf", "#9467bd", "#7f7f7f", "#2f4b7c", "#8c9d3a", "#6a51a3",
           "#4b8bbe", "#5f9ea0", "#b0a0d0", "#3d3d3d", "#76b7b2", "#59a14f", "#a0c4e8")


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]   # (t, y), t in seconds of the run's clock
    mark: str | None = None                 # e.g. "straggler: 49 % slower": drawn red


@dataclass(frozen=True)
class Mark:
    """A moment on the time axis: a vertical line with a label."""
    t: float
    label: str
    ok: bool = False   # green (training again), else red (a failure)


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def thin(points: Sequence[tuple[float, float]], t0: float, t1: float,
         limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """POINTS, at most LIMIT of them: the mean of each of LIMIT equal spans of [T0, T1]."""
    if len(points) <= limit:
        return list(points)
    span = (t1 - t0) / limit or 1.0
    buckets: dict[int, list[tuple[float, float]]] = {}
    for t, y in points:
        buckets.setdefault(min(limit - 1, int((t - t0) / span)), []).append((t, y))
    return [(sum(t for t, _ in b) / len(b), sum(y for _, y in b) / len(b))
            for _, b in sorted(buckets.items())]


def ticks(value: float) -> tuple[list[float], float]:
    """A y axis from 0 up to VALUE (the data's highest): 4 to 6 ticks a round step apart
    (1, 2 or 5 x 10^k), the last at or above VALUE; and the step."""
    if not 0 < value < math.inf:
        value = 1.0
    power = 10.0 ** math.floor(math.log10(value / 5))
    for factor in (1, 2, 5, 10):   # the smallest step that needs at most 5 of them
        step = factor * power
        count = math.ceil(value / step - 1e-9)
        if count <= 5:
            break
    return [round(i * step, _decimals(step)) for i in range(count + 1)], step


def _decimals(step: float) -> int:
    """The digits after the point that a multiple of STEP (1, 2 or 5 x 10^k) needs."""
    return max(0, -math.floor(math.log10(step) + 1e-9))


SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
SMALL = ((1e-6, "µ"), (1e-9, "n"), (1e-12, "p"))   # below 0.0001 decimals get too wide


def number(v: float, step: float) -> str:
    """V, a multiple of STEP, as a reader writes it: no exponent, no float noise, no
    trailing zeros; from a thousand on with k, M, G or T (1.5k, 20M); plain decimals down
    to steps of 0.0001, then a whole axis in µ, n or p (20µ, 40µ)."""
    scale, suffix = next(((sc, sf) for sc, sf in SI if abs(v) >= sc), (1.0, ""))
    if step < 1e-4 and v:
        scale, suffix = next(((sc, sf) for sc, sf in SMALL if sc <= 10 * step), SMALL[-1])
    text = f"{v / scale:.{_decimals(step / scale)}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return ("0" if text == "-0" else text) + suffix


# Round steps of elapsed time: 1, 2, 3, 5, 10, 15, 30 s and min; 1, 2, 3, 6, 12 h; days.
TIME_STEPS = (1, 2, 3, 5, 10, 15, 30, 60, 120, 180, 300, 600, 900, 1800, 3600, 7200,
              10800, 21600, 43200, 86400, 2 * 86400, 3 * 86400, 7 * 86400)


def time_ticks(span: float) -> list[float]:
    """Ticks over [0, SPAN] seconds a round step apart (TIME_STEPS, then whole weeks
    doubled), the smallest that leaves at most 7: 4 to 7 of them (over 3 s and more)."""
    step = next((s for s in TIME_STEPS if span / s < 7 - 1e-9), None)
    if step is None:
        step = TIME_STEPS[-1]
        while span / step >= 7 - 1e-9:
            step *= 2
    return [float(i * step) for i in range(int(span / step + 1e-9) + 1)]


def clock(seconds: float, hours: bool = False) -> str:
    """Seconds from the run's start as m:ss, or h:mm:ss from an hour on (or if HOURS)."""
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    return (f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h or hours
            else f"{rest // 60}:{rest % 60:02d}")


def _num(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def segments(points: list[tuple[float, float]], gap: float) -> list[list[tuple[float, float]]]:
    """POINTS cut where two follow each other more than GAP apart (no beats between
    them: a recovery's restart), so that no line is drawn across the silence."""
    parts: list[list[tuple[float, float]]] = []
    for point in points:
        if not parts or point[0] - parts[-1][-1][0] > gap:
            parts.append([])
        parts[-1].append(point)
    return parts


def line_chart(title: str, unit: str, series: Sequence[Series], t0: float, t1: float,
               marks: Sequence[Mark] = (), css_class: str = "chart",
               gap: float = float("inf")) -> str:
    """One line per series over [T0, T1] (T0 shown as 0:00), the marks as vertical lines,
    a legend on the right with the marked series first; a line is cut where two of its
    points are more than GAP apart (or two of its thinned spans)."""
    t1 = max(t1, t0 + 1.0)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    levels, step = ticks(max((y for s in series for _, y in s.points), default=1.0))
    top = levels[-1]

    def x(t: float) -> float:
        return LEFT + (t - t0) / (t1 - t0) * plot_w

    def y(v: float) -> float:
        return TOP + plot_h - min(v, top) / top * plot_h

    out = [f'<svg class="{escape(css_class)}" xmlns="http://www.w3.org/2000/svg" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
           f'aria-label="{escape(title)}">',
           f'<text x="{LEFT}" y="18" class="title">{escape(title)}</text>']
    for v in levels:   # the grid and the y axis' numbers
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   'class="grid"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end" class="tick" '
                   f'data-axis="y">{number(v, step)}</text>')
    out.append(f'<text x="14" y="{TOP + plot_h / 2:.0f}" class="tick" transform="rotate(-90 '
               f'14 {TOP + plot_h / 2:.0f})" text-anchor="middle">{escape(unit)}</text>')
    for dt in time_ticks(t1 - t0):   # the time axis: h:mm:ss all along from an hour on
        out.append(f'<text x="{x(t0 + dt):.1f}" y="{HEIGHT - 12}" text-anchor="middle" '
                   f'class="tick" data-axis="t">{clock(dt, hours=t1 - t0 >= 3600)}</text>')
    for n, mark in enumerate(m for m in marks if t0 <= m.t <= t1):
        stroke = OK_COLOR if mark.ok else MARK_COLOR
        at = x(mark.t)
        # The label on the side with room, a line lower for each mark (they may be close).
        side = (f'x="{at - 3:.1f}" text-anchor="end"' if at > LEFT + plot_w * 0.7
                else f'x="{at + 3:.1f}"')
        out.append(f'<g class="mark" data-label="{escape(mark.label)}"><line '
                   f'x1="{at:.1f}" x2="{at:.1f}" y1="{TOP}" y2="{TOP + plot_h}" '
                   f'stroke="{stroke}" stroke-dasharray="4 3"/><text {side} '
                   f'y="{TOP + 10 + 12 * (n % 4)}" class="tick" fill="{stroke}">'
                   f'{escape(mark.label)}</text></g>')
    def look(i: int, s: Series) -> tuple[str, float, str]:
        return ((MARK_COLOR, 3.0) if s.mark else (color(i), 1.5)) + (
            f'data-node="{escape(s.name)}"' + (f' data-mark="{escape(s.mark)}"' if s.mark
                                               else ""),)

    # The marked series drawn last (on top of the others), and named first in the legend.
    for i, s in sorted(enumerate(series), key=lambda item: item[1].mark is not None):
        stroke, width, attrs = look(i, s)
        for part in segments(thin(s.points, t0, t1), max(gap, 2 * (t1 - t0) / MAX_POINTS)):
            pts = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in part)
            out.append(f'<polyline class="series{" marked" if s.mark else ""}" {attrs} '
                       f'points="{pts}" fill="none" stroke="{stroke}" '
                       f'stroke-width="{width}"/>')
        if len(s.points) <= DOTS:   # a short run's few points (one is no line at all)
            out += [f'<circle class="dot" cx="{x(t):.1f}" cy="{y(v):.1f}" r="{width + 1}" '
                    f'fill="{stroke}"/>' for t, v in s.points]
    ordered = sorted(enumerate(series), key=lambda item: item[1].mark is None)
    for n, (i, s) in enumerate(ordered):
        stroke, width, attrs = look(i, s)
        label = s.name + (f" ({s.mark})" if s.mark else "")
        ly = TOP + 4 + n * 15
        if ly < HEIGHT - 20:   # the legend's room; the rest are counted below
            out.append(f'<g class="legend" {attrs}><line x1="{WIDTH - RIGHT + 36}" '
                       f'x2="{WIDTH - RIGHT + 54}" y1="{ly:.0f}" y2="{ly:.0f}" stroke="{stroke}" '
                       f'stroke-width="{width}"/><text x="{WIDTH - RIGHT + 59}" y="{ly + 4:.0f}" '
                       f'class="tick">{escape(label)}</text></g>')
    shown = sum(1 for n in range(len(ordered)) if TOP + 4 + n * 15 < HEIGHT - 20)
    if shown < len(ordered):
        out.append(f'<text x="{WIDTH - RIGHT + 36}" y="{TOP + 8 + shown * 15}" class="tick">'
                   f'and {len(ordered) - shown} more</text>')
    out.append("</svg>")
    return "\n".join(out)


HEAT = ((0.0, (127, 0, 0)), (0.5, (244, 162, 97)), (1.0, (232, 245, 233)))


def heat(value: float, top: float) -> str:
    """A cell's colour: dark red for nothing, orange at half of TOP, pale green at TOP."""
    f = 0.0 if top <= 0 else max(0.0, min(1.0, value / top))
    (f0, c0), (f1, c1) = (HEAT[0], HEAT[1]) if f <= HEAT[1][0] else (HEAT[1], HEAT[2])
    k = (f - f0) / (f1 - f0)
    r, g, b = (round(a + (c - a) * k) for a, c in zip(c0, c1, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(title: str, labels: Sequence[str], cells: dict[tuple[str, str], float | None],
            unit: str, marked: Sequence[str] = ()) -> str:
    """A square matrix: row sends, column receives; a cell's colour its value against the
    highest (None: failed, drawn black); MARKED rows' labels in red with a mark."""
    size = max(18, min(48, 640 // max(1, len(labels))))
    pad = max(len(label) for label in labels) * 7 + 30 if labels else 40
    w = max(pad + size * len(labels) + 20, 8 * len(title) + 20)
    h = 40 + pad + size * len(labels)
    top = max((v for v in cells.values() if v is not None), default=1.0)
    out = [f'<svg class="heatmap" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" '
           f'width="{w}" height="{h}" role="img" aria-label="{escape(title)}">',
           f'<text x="4" y="18" class="title">{escape(title)}</text>']
    y0 = 40 + pad
    for j, dst in enumerate(labels):
        cx = pad + j * size + size / 2
        out.append(f'<text class="tick" transform="translate({cx + 4:.0f} {y0 - 6}) '
                   f'rotate(-60)">{escape(dst)}</text>')
    for i, src in enumerate(labels):
        flag = src in marked
        look = f' class="tick marked" fill="{MARK_COLOR}"' if flag else ' class="tick"'
        out.append(f'<text x="{pad - 6}" y="{y0 + i * size + size / 2 + 4:.0f}" '
                   f'text-anchor="end"{look} data-row="{escape(src)}">'
                   f'{"⚠ " if flag else ""}{escape(src)}</text>')
        for j, dst in enumerate(labels):
            if src == dst:
                continue
            v = cells.get((src, dst))
            if (src, dst) not in cells:
                continue
            fill = "#000000" if v is None else heat(v, top)
            text = "failed" if v is None else f"{src} → {dst}: {v:.3g} {unit}"
            out.append(f'<rect class="cell" data-src="{escape(src)}" data-dst="{escape(dst)}" '
                       f'data-value="{"" if v is None else _num(v)}" x="{pad + j * size}" '
                       f'y="{y0 + i * size}" width="{size - 1}" height="{size - 1}" '
                       f'fill="{fill}"><title>{escape(text)}</title></rect>')
            if size >= 36 and v is not None:
                out.append(f'<text x="{pad + j * size + size / 2:.0f}" '
                           f'y="{y0 + i * size + size / 2 + 4:.0f}" text-anchor="middle" '
                           f'class="cellnum">{v:.3g}</text>')
    out.append("</svg>")
    return "\n".join(out)


@dataclass(frozen=True)
class Dot:
    """One point of a scatter chart: a trial's value of a parameter (as its file gave it)
    against its metric."""
    x: str
    y: float
    label: str            # the trial: "t3"
    best: bool = False    # drawn red, and named


def _as_numbers(values: Sequence[str]) -> list[float] | None:
    try:
        numbers = [float(v) for v in values]
    except ValueError:
        return None
    return numbers if all(math.isfinite(n) for n in numbers) else None


def axis(lo: float, hi: float) -> tuple[list[float], float]:
    """Ticks a round step apart (ticks()) from at or below LO to at or above HI, 0 among
    them when LO and HI are of one sign and LO's own scale holds it."""
    if lo >= 0:
        return ticks(hi)
    if hi <= 0:
        levels, step = ticks(-lo)
        return sorted(-v for v in levels), step
    _, step = ticks(hi - lo)
    first = math.floor(lo / step + 1e-9) * step
    count = math.ceil((hi - first) / step - 1e-9)
    return [round(first + i * step, _decimals(step)) for i in range(count + 1)], step


def scatter(title: str, x_title: str, y_title: str, dots: Sequence[Dot]) -> str:
    """DOTS over their parameter: each value of it a column, in numeric order when every
    value is a number (a grid's values, evenly apart whatever their scale), else in the
    order first seen; the best dot red, with its trial named. Random draws of a number
    (more than CATEGORIES distinct values) are placed by value instead, on a log axis when
    they are positive and span 20x or more."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    xs = list(dict.fromkeys(d.x for d in dots))
    numbers = _as_numbers(xs)
    ys = [d.y for d in dots] or [1.0]
    levels, step = axis(min(ys), max(ys))
    bottom, top = levels[0], levels[-1]
    if top == bottom:
        top = bottom + 1.0

    def y(v: float) -> float:
        return TOP + plot_h - (v - bottom) / (top - bottom) * plot_h

    labels: list[tuple[float, str]]
    if numbers is not None and len(xs) > CATEGORIES:
        log = min(numbers) > 0 and max(numbers) / min(numbers) >= 20
        f = (lambda v: math.log10(v)) if log else (lambda v: v)
        lo, hi = f(min(numbers)), f(max(numbers))
        hi = hi if hi > lo else lo + 1.0

        def place(v: str) -> float:
            return LEFT + 20 + (f(float(v)) - lo) / (hi - lo) * (plot_w - 40)
        if log:
            decades = range(math.ceil(lo - 1e-9), math.floor(hi + 1e-9) + 1)
            labels = [(LEFT + 20 + (k - lo) / (hi - lo) * (plot_w - 40),
                       number(10.0 ** k, 10.0 ** min(k, 0))) for k in decades]
        else:
            marks, xstep = axis(lo, hi)
            labels = [(place(str(v)), number(v, xstep)) for v in marks if lo <= v <= hi]
    else:
        order = sorted(xs, key=lambda v: float(v)) if numbers is not None else xs
        slot = (plot_w - 40) / max(1, len(order) - 1) if len(order) > 1 else 0.0
        at = {v: LEFT + 20 + i * slot if len(order) > 1 else LEFT + plot_w / 2
              for i, v in enumerate(order)}

        def place(v: str) -> float:
            return at[v]
        labels = [(at[v], v) for v in order]
    out = [f'<svg class="scatter" xmlns="http://www.w3.org/2000/svg" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
           f'aria-label="{escape(title)}">',
           f'<text x="{LEFT}" y="18" class="title">{escape(title)}</text>']
    for v in levels:
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   'class="grid"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end" class="tick" '
                   f'data-axis="y">{number(v, step)}</text>')
    out.append(f'<text x="14" y="{TOP + plot_h / 2:.0f}" class="tick" transform="rotate(-90 '
               f'14 {TOP + plot_h / 2:.0f})" text-anchor="middle">{escape(y_title)}</text>')
    for at_x, text in labels:
        out.append(f'<text x="{at_x:.1f}" y="{HEIGHT - 16}" text-anchor="middle" class="tick" '
                   f'data-axis="x">{escape(text)}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 2}" text-anchor="middle" '
               f'class="tick">{escape(x_title)}</text>')
    for d in sorted(dots, key=lambda d: d.best):   # the best drawn last, on top
        fill = MARK_COLOR if d.best else PALETTE[0]
        cx, cy = place(d.x), y(d.y)
        out.append(f'<circle class="dot{" best" if d.best else ""}" data-trial="'
                   f'{escape(d.label)}" data-x="{escape(d.x)}" data-y="{d.y:.6g}" '
                   f'cx="{cx:.1f}" cy="{cy:.1f}" r="{5 if d.best else 4}" fill="{fill}" '
                   f'fill-opacity="0.8"><title>{escape(d.label)}: {escape(x_title)} '
                   f'{escape(d.x)}, {escape(y_title)} {d.y:.6g}</title></circle>')
        if d.best:
            out.append(f'<text x="{cx + 8:.1f}" y="{cy + 4:.1f}" class="tick" '
                       f'fill="{MARK_COLOR}">best: {escape(d.label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


CATEGORIES = 8   # a parameter with at most this many values: each a column of its own
