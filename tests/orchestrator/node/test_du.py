"""`node.py du`: the share's bytes by owner and kind, walked for real on a directory tree
made here (as this test's user: every file is theirs; what another user may not read is
the sandbox test's, tests/orchestrator/cluster/test_share_usage_sandbox.py)."""

from __future__ import annotations

import getpass
import os
from pathlib import Path

from orchestrator.cli.cmd_du import table
from orchestrator.node import du
from orchestrator.node.answers import DuAnswer
from orchestrator.node.health import walk

MIB = 1 << 20


def write(path: Path, mib: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(mib * MIB))
    return path


def test_each_kind_of_the_share_is_counted_once(tmp_path: Path) -> None:
    write(tmp_path / "checkpoints" / "alice" / "resnet" / "step3.pt", 3)
    write(tmp_path / "checkpoints" / "alice" / ".clustertrain" / "runs" / "r1" / "n0.json", 1)
    write(tmp_path / "data" / "cifar10" / "train.bin", 2)
    wheel = write(tmp_path / "wheelhouse-bob" / "torch.whl", 4)
    (tmp_path / "wheelhouse").mkdir()
    os.link(wheel, tmp_path / "wheelhouse" / "torch.whl")   # two names, its bytes once
    write(tmp_path / "notes" / "x", 1)
    found = du.usage(str(tmp_path))
    me = found["users"][getpass.getuser()]
    # Each file's bytes, give or take the directories' own blocks (a few KiB).
    assert {k: round(v / MIB) for k, v in me.items()} == {
        "checkpoints": 3, "run records": 1, "data": 2, "wheelhouses": 4, "other": 1}
    assert found["share"] == str(tmp_path.resolve()) and found["unread"] == []
    assert 0 < found["free"] <= found["total"]


def test_the_kind_is_read_from_where_a_path_lies() -> None:
    assert du.kind_of(("checkpoints", "bob", "a.pt")) == "checkpoints"
    assert du.kind_of(("checkpoints", "bob", ".clustertrain", "runs")) == "run records"
    assert du.kind_of(("checkpoints", ".clustertrain")) == "checkpoints"
    assert du.kind_of(("wheelhouse-tools", "x.whl")) == "wheelhouses"
    assert du.kind_of(("data",)) == "data" and du.kind_of(("srv",)) == "other"


def test_the_table_puts_the_biggest_user_first_and_names_what_it_did_not_read(
        tmp_path: Path) -> None:
    write(tmp_path / "checkpoints" / "alice" / "a.pt", 2)
    found = du.usage(str(tmp_path))
    found["users"]["bob"] = {k: 0 for k in du.KINDS} | {"data": 5 * MIB}   # the biggest
    found["unread"] = [{"path": f"{tmp_path}/checkpoints/carol", "owner": "carol",
                        "why": "Permission denied"}]
    lines = table(DuAnswer.from_json(found))
    assert lines[0].startswith(f"the share {tmp_path.resolve()}: ") and " free of " in lines[0]
    assert lines[1].split() == ["USER", "CHECKPOINTS", "RUN", "RECORDS", "DATA",
                                "WHEELHOUSES", "OTHER", "TOTAL"]
    assert lines[2].split()[0] == "bob" and lines[2].split()[-2:] == ["5", "MiB"]
    assert lines[3].split()[0] == getpass.getuser()
    assert lines[4] == (f"not read: {tmp_path}/checkpoints/carol (owned by carol): "
                        "Permission denied; an admin sees it with du --all")


def test_a_directory_swapped_for_a_link_mid_walk_is_not_followed(tmp_path: Path) -> None:
    """bob swaps a directory of his, once the walk has seen it, for a link to a big tree:
    the walk (du's, the health check's count of who fills the share) does not count the
    tree through it, nor through a plain link to it."""
    share = tmp_path / "share"
    write(tmp_path / "big" / "blob", 8)
    (share / "checkpoints" / "bob" / "x").mkdir(parents=True)
    write(share / "checkpoints" / "bob" / "x" / "small", 1)
    (share / "checkpoints" / "bob" / "to-big").symlink_to(tmp_path / "big")
    counted = 0
    for st, parts in walk(str(share)):
        counted += st.st_blocks * 512
        if parts == ("checkpoints", "bob", "x"):
            (share / "checkpoints" / "bob" / "x").rename(share / "checkpoints" / "bob" / "y")
            (share / "checkpoints" / "bob" / "x").symlink_to(tmp_path / "big")
    assert counted < 4 * MIB, counted   # bob's 1 MiB and the directories, not the 8 MiB
