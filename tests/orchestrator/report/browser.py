"""A page as a reader sees it: headless Chromium renders it (with every network request
refused) into a screenshot, kept as a test artifact, and into its DOM after loading.

Chromium is a system package (`make test-deps` installs it); without it these tests fail and say
so: a report nobody looked at is not tested."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

ARTIFACTS = Path(os.environ.get("CLUSTERTRAIN_TEST_ARTIFACTS",
                                Path(__file__).parents[3] / ".cache" / "test-artifacts"))
# No request leaves: names do not resolve, and a proxy that is not there takes the rest.
OFFLINE = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9"]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "headless Chromium is needed to look at the report: `make test-deps` installs it"
    return found


def _run(args: list[str], page: Path | str, timeout: float = 90) -> subprocess.CompletedProcess:
    url = page if isinstance(page, str) else page.absolute().as_uri()
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", "--no-first-run", *OFFLINE, *args, url],
                          capture_output=True, timeout=timeout, check=True)


def screenshot(page: Path | str, name: str, width: int = 1200, height: int = 2400) -> Path:
    """PAGE drawn at WIDTH x HEIGHT into ARTIFACTS/NAME.png."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    out = ARTIFACTS / f"{name}.png"
    out.unlink(missing_ok=True)
    _run([f"--window-size={width},{height}", f"--screenshot={out}"], page)
    assert out.exists(), f"Chromium wrote no screenshot of {page}"
    return out


class Element:
    def __init__(self, tag: str, attrs: dict[str, str]) -> None:
        self.tag, self.attrs, self.text = tag, attrs, ""

    def has_class(self, name: str) -> bool:
        return name in self.attrs.get("class", "").split()


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.elements: list[Element] = []
        self._open: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.elements.append(element)
        if tag not in ("meta", "line", "polyline", "rect", "br", "link", "img", "input"):
            self._open.append(element)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop().tag == tag:
                break

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element.text += data


def dom(page: Path | str) -> list[Element]:
    """Every element of PAGE's DOM once Chromium has loaded it, in document order."""
    return elements(_run(["--dump-dom"], page).stdout.decode("utf-8", errors="replace"))


def elements(markup: str) -> list[Element]:
    """Every element of MARKUP (HTML or inline SVG), in document order."""
    parser = _Collect()
    parser.feed(markup)
    return parser.elements


def pixels(png: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and rows of RGB(A) bytes of an 8-bit, non-interlaced PNG (Chromium's)."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and ctype in (2, 6) and interlace == 0, "an unexpected PNG format"
    bpp = 4 if ctype == 6 else 3
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        at = y * (stride + 1)
        kind, line = raw[at], bytearray(raw[at + 1:at + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def count_color(png: Path, rgb: str, tolerance: int = 24) -> int:
    """How many pixels of PNG are within TOLERANCE (each channel) of RGB ("#rrggbb")."""
    want = bytes.fromhex(rgb.lstrip("#"))
    width, _, rows = pixels(png)
    bpp = len(rows[0]) // width
    found = 0
    for row in rows:
        for i in range(0, len(row), bpp):
            if all(abs(row[i + k] - want[k]) <= tolerance for k in range(3)):
                found += 1
    return found


def series(elements: list[Element], chart: str) -> dict[str, dict[str, str]]:
    """The lines drawn in CHART (the svg's class: step, rate, loss): node -> the
    polyline's attributes (data-mark on a marked one), the points of every piece of the
    node's line (cut where the beats stopped) in "points"."""
    inside = False
    found: dict[str, dict[str, str]] = {}
    for e in elements:
        if e.tag == "svg":
            inside = e.has_class(chart)
        elif inside and e.tag == "polyline" and e.has_class("series"):
            node = e.attrs["data-node"]
            before = found.get(node, {}).get("points")
            found[node] = {**e.attrs, **({"points": f"{before} {e.attrs['points']}"}
                                         if before else {})}
    return found


def marked_rows(elements: list[Element]) -> list[str]:
    """The heatmap's rows whose label is marked (a suspect)."""
    return [e.attrs["data-row"] for e in elements if e.attrs.get("data-row")
            and e.has_class("marked")]


def suspects(elements: list[Element]) -> list[str]:
    """The hang's suspects the page names, as node/rank."""
    return [e.attrs["data-suspect"] for e in elements if e.attrs.get("data-suspect")]

