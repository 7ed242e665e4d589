"""Free space where runs write, and the supervisor's word on a run that died of its lack."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.node import space
from orchestrator.node.protocol import NO_SPACE_MARKER


def test_free_space_is_read_once_per_filesystem_and_a_missing_place_is_named(
        tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    found = space.space({"share": str(tmp_path), "home": str(tmp_path / "a"),
                        "tmp": str(tmp_path / "gone")})
    assert [p["what"] for p in found] == ["share", "tmp"]   # a/ is on the share's filesystem
    st = os.statvfs(tmp_path)
    assert found[0]["total"] == st.f_blocks * st.f_frsize and 0 < found[0]["free"] <= \
        found[0]["total"] and 0 < found[0]["ifree"] <= found[0]["itotal"]
    assert found[1] == {"what": "tmp", "path": str(tmp_path / "gone"),
                        "error": "No such file or directory"}



# What a rank printed when its disk was full (Python 3.12's and torch 2.13's own words).
PY_FULL = ("node2/rank2 | OSError: [Errno 28] No space left on device: '{}'\n")
TORCH_FULL = ("node2/rank2 | RuntimeError: [enforce fail at inline_container.cc:672] . "
              "unexpected pos 640 vs 534\n")


def figures(free: dict[str, tuple[int, int, int, int]]):
    """space() as a node with these (free, total, ifree, itotal) per place would read it:
    the filesystems this test cannot fill."""
    def read(places: dict[str, str]) -> list[dict]:
        return [{"what": what, "path": path, "free": f, "total": t, "ifree": fi,
                 "itotal": ti} for what, path in places.items()
                for f, t, fi, ti in [free.get(what, (9 << 30, 10 << 30, 900, 1000))]]
    return read


@pytest.mark.parametrize("said", [PY_FULL.format("/nowhere/ckpt.pt"), TORCH_FULL])
def test_a_full_disk_is_named_with_its_figures(tmp_path: Path, monkeypatch, said) -> None:
    log = tmp_path / "output.log"
    log.write_text("node2/rank2 | step 3\n" + said)
    monkeypatch.setattr(space, "space", figures({"temporary files": (12 << 10, 64 << 20, 9, 10)}))
    note = space.out_of_space(str(log), str(tmp_path))
    assert note is not None and note.startswith(NO_SPACE_MARKER), note
    assert note.endswith(" (temporary files) has 12 KiB free of 64 MiB"), note


def test_the_file_the_error_named_and_inodes_run_out(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "ckpt").mkdir()
    log = tmp_path / "output.log"
    log.write_text(PY_FULL.format(tmp_path / "ckpt" / "step3.pt"))
    monkeypatch.setattr(space, "space", figures(
        {"the file it wrote": (5 << 30, 10 << 30, 0, 1000)}))
    note = space.out_of_space(str(log), None)
    assert note == (f"{NO_SPACE_MARKER} {tmp_path / 'ckpt'} (the file it wrote) has 0 inodes "
                    "free of 1000"), note


def test_a_failure_that_says_nothing_of_space_gets_no_note(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_text("node2/rank2 | RuntimeError: the script's own error\n")
    assert space.out_of_space(str(log), str(tmp_path)) is None
    assert space.out_of_space(str(tmp_path / "missing.log"), None) is None


def test_the_real_places_are_measured(tmp_path: Path) -> None:
    """Without a stand-in: the share's mount, home and /tmp, read on this machine."""
    log = tmp_path / "output.log"
    log.write_text(TORCH_FULL)
    note = space.out_of_space(str(log), str(tmp_path))
    assert note is not None and " has " in note and " free of " in note, note
    assert os.path.ismount(space.mount_of(str(tmp_path)))
