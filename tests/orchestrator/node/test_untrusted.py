"""Reading what other users wrote on a shared place (roles/slurm/files/untrusted.py, the
module orchestrator.node.untrusted), on real files: a pipe, a link to /dev/zero, a file too
big or of another owner are refused naming the file and why, without hanging or reading
without end; a listing keeps a bounded number of each owner's entries and follows no link;
text from another user reaches a terminal with its escapes made visible. Files of another
owner: the system's users daemon (uid 1) and bin (uid 2), as root."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from orchestrator.node import untrusted

DAEMON, BIN = 1, 2
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="files of other owners need root")


@pytest.mark.timeout(20)
def test_a_pipe_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "state.json")
    started = time.monotonic()
    with pytest.raises(untrusted.NotRead, match="not a regular file") as got:
        untrusted.read_bytes(str(tmp_path / "state.json"), 1024)
    assert time.monotonic() - started < 2
    assert got.value.path == str(tmp_path / "state.json")


@pytest.mark.timeout(20)
def test_a_link_to_dev_zero_is_refused_not_read_without_end(tmp_path: Path) -> None:
    (tmp_path / "state.json").symlink_to("/dev/zero")
    with pytest.raises(untrusted.NotRead, match="a symbolic link: not followed"):
        untrusted.read_bytes(str(tmp_path / "state.json"), 1024)


def test_a_file_is_read_up_to_its_limit_and_refused_above_it(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 100)
    assert untrusted.read_bytes(str(tmp_path / "a"), 100) == b"x" * 100
    with pytest.raises(untrusted.NotRead, match="bigger than 99 bytes"):
        untrusted.read_bytes(str(tmp_path / "a"), 99)


def test_a_file_is_read_relative_to_a_directory_opened_without_links(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a").write_text("1")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(untrusted.NotRead, match="a symbolic link"):
        untrusted.open_dir(str(tmp_path / "link"))
    fd = untrusted.open_dir(str(tmp_path / "real"))
    try:
        assert untrusted.read_bytes("a", 10, dir_fd=fd) == b"1"
    finally:
        os.close(fd)


def test_a_directory_swapped_for_a_link_after_it_was_seen_is_not_opened(
        tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "big").mkdir()
    seen = os.lstat(tmp_path / "mine")
    (tmp_path / "mine").rmdir()
    (tmp_path / "big").rename(tmp_path / "mine")   # another directory in its place
    with pytest.raises(untrusted.NotRead, match="replaced while it was read"):
        untrusted.open_dir(str(tmp_path / "mine"), seen=seen)


@as_root
def test_a_file_of_another_owner_than_the_one_expected_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("{}")
    os.chown(tmp_path / "a", BIN, BIN)
    assert untrusted.read_bytes(str(tmp_path / "a"), 10, uid=BIN) == b"{}"
    with pytest.raises(untrusted.NotRead, match="owned by uid 2, not uid 1") as got:
        untrusted.read_bytes(str(tmp_path / "a"), 10, uid=DAEMON)
    assert got.value.uid == BIN


@as_root
def test_a_listing_keeps_the_newest_few_of_each_owner(tmp_path: Path) -> None:
    """bin's thousand files cost a reader 3 of them; daemon's two are both kept."""
    for i in range(1000):
        path = tmp_path / f"bin{i:04}"
        path.write_text("")
        os.utime(path, (i, i))
        os.chown(path, BIN, BIN)
    for name in ("d1", "d2"):
        (tmp_path / name).write_text("")
        os.chown(tmp_path / name, DAEMON, DAEMON)
    (tmp_path / ".tmp").write_text("")
    got = untrusted.listing(str(tmp_path), 3, wanted=lambda n: not n.startswith("."))
    assert [e.name for e in got.kept] == ["bin0997", "bin0998", "bin0999", "d1", "d2"]
    assert got.beyond == {BIN: 997}


def test_a_listing_does_not_follow_links(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "to-dir").symlink_to(tmp_path / "dir")
    kept = {e.name: e.info for e in untrusted.listing(str(tmp_path), 10).kept}
    assert stat.S_ISLNK(kept["to-dir"].st_mode) and stat.S_ISDIR(kept["dir"].st_mode)


def test_text_from_another_user_shows_its_escapes() -> None:
    said = "bad fan\x1b[1A\x1b[2K\rno node is cordoned\u202e\u2028"
    assert untrusted.visible(said) == \
        "bad fan\\x1b[1A\\x1b[2K\\x0dno node is cordoned\\u202e\\u2028"
    assert untrusted.visible("ventilateur cassé, GPU 3") == "ventilateur cassé, GPU 3"
    assert untrusted.visible("\u0430lice", ascii_only=True) == "\\u0430lice"   # Cyrillic а
    assert untrusted.visible("\U000e0041") == "\\U000e0041"
