"""Unchanged code is not synced again: the local digest, and the node-side shell that seals a
snapshot and links the next one from it, run here with a real sh, find and cp."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from orchestrator.cluster.inventory import Cluster, NodeSpec
from orchestrator.cluster.ssh import Connection, Result, SshTarget
from orchestrator.errors import LaunchError
from orchestrator.run.sync import (
    carry,
    code_digest,
    reuse_and_carry,
    reuse_command,
    seal_command,
    work_key,
)

from ..local_node import Canned, LocalNode, installed


def code_tree(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text("print('v1')\n")
    (root / ".gitignore").write_text("*.ckpt\n")
    (root / "data" / "model.ckpt").write_text("weights")
    return root


def test_the_digest_changes_with_what_the_sync_would_send(tmp_path) -> None:
    code = code_tree(tmp_path / "code")
    first = code_digest(code)
    # What rsync leaves out does not count: ignored files, __pycache__/, .git/.
    (code / "data" / "model.ckpt").write_text("other weights, longer")
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (code / ".git").mkdir()
    (code / ".git" / "HEAD").write_text("ref")
    os.utime(code / "data", ns=(0, 10**9))  # directories: not their times
    assert code_digest(code) == first
    # An edit that keeps the size and lands within the same second still counts.
    stat = (code / "train.py").stat()
    (code / "train.py").write_text("print('v2')\n")
    os.utime(code / "train.py", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    edited = code_digest(code)
    assert edited != first
    (code / "new.py").write_text("")
    assert code_digest(code) != edited
    (code / "new.py").unlink()
    assert code_digest(code) == edited


def on_node(home: Path, command: str) -> int:
    """COMMAND as a node runs it (a login shell runs the string), with HOME as $HOME."""
    return subprocess.run(command, shell=True, env={**os.environ, "HOME": str(home)},
                          capture_output=True, timeout=30).returncode


def test_a_sealed_untouched_snapshot_is_linked_not_copied(tmp_path) -> None:
    home = tmp_path / "home with space"
    root = home / ".clustertrain" / "code"
    snap = code_tree(root / "r1")
    (snap / ".clustertrain").mkdir()
    (snap / ".clustertrain" / "run_worker.py").write_text("runner")
    (root / "latest").symlink_to("r1")
    assert on_node(home, seal_command("r1", "D1")) == 0
    assert (snap / ".clustertrain" / "synced").read_text().split()[0] == "D1"

    # Other code, or no seal: the node says so and nothing is made.
    assert on_node(home, reuse_command("r2", "D2")) == 3
    assert not (root / "r2").exists() and os.readlink(root / "latest") == "r1"

    # The same code, and the previous job only wrote bytecode: a linked copy.
    (snap / "__pycache__").mkdir()
    (snap / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert on_node(home, reuse_command("r2", "D1")) == 0
    r2 = root / "r2"
    assert (r2 / "train.py").stat().st_ino == (snap / "train.py").stat().st_ino
    assert (r2 / ".clustertrain" / "run_worker.py").read_text() == "runner"
    assert os.readlink(root / "latest") == "r2"
    # r2 has a seal of its own; r1's is left as it was.
    assert (r2 / ".clustertrain" / "synced").stat().st_ino != \
        (snap / ".clustertrain" / "synced").stat().st_ino
    assert (r2 / ".clustertrain" / "synced").read_text().split()[0] == "D1"

    # A job that wrote into its working directory: the next run is synced, not linked.
    (r2 / "outputs").mkdir()
    (r2 / "outputs" / "log.txt").write_text("step 1")
    assert on_node(home, reuse_command("r3", "D1")) == 3
    (r2 / "outputs" / "log.txt").unlink()
    (r2 / "outputs").rmdir()
    # Nor one edited on the node.
    (r2 / "train.py").write_text("print('edited on the node')\n")
    assert on_node(home, reuse_command("r3", "D1")) == 3
    assert not (root / "r3").exists()


def test_linked_code_and_the_last_runs_files_come_in_one_round_trip(tmp_path) -> None:
    """Unchanged code: the new snapshot is linked and the last run's files from the same
    work directory carried into it (node/carry.py) by one command per node, not two
    rounds over every node; code that changed runs nothing more (the sync comes first)."""
    home = tmp_path / "n0"
    installed(home)
    root = home / ".clustertrain" / "code"
    work = code_tree(tmp_path / "work")
    snap = code_tree(root / "r1")
    (root / "latest").symlink_to("r1")
    assert on_node(home, seal_command("r1", "D1")) == 0
    cluster = Cluster(tmp_path / "hosts", (NodeSpec("n0", SshTarget("127.0.0.1"), "127.0.0.1",
                                                    python=sys.executable),))
    node = LocalNode(home)
    clients = {"n0": cast(Connection, node)}
    assert carry(cluster, work, "r1", clients, ["n0"])["n0"]["from"] is None   # WORK's first

    node.runs.clear()
    assert reuse_and_carry(cluster, work, "r2", "D2", clients) == {}
    assert not (root / "r2").exists() and len(node.runs) == 1

    node.runs.clear()
    found = reuse_and_carry(cluster, work, "r2", "D1", clients)
    assert len(node.runs) == 1
    assert found["n0"]["from"] == "r1" and found["n0"]["carried"] == []
    assert (root / "r2" / "train.py").stat().st_ino == (snap / "train.py").stat().st_ino
    assert os.readlink(root / ".work" / work_key(work)) == "../r2"   # WORK's latest now


def test_a_node_that_carries_with_no_answer_fails_the_launch_naming_it(tmp_path) -> None:
    """A LaunchError that names the node and what it said, as when the carry fails."""
    cluster = Cluster(tmp_path / "hosts", (NodeSpec("n0", SshTarget("127.0.0.1"), "127.0.0.1"),))
    node = Canned(Result(0, "", ""))
    with pytest.raises(LaunchError) as caught:
        reuse_and_carry(cluster, tmp_path, "r2", "D1", {"n0": cast(Connection, node)})
    assert str(caught.value) == ("n0: could not carry the last run's files into the new "
                                 "snapshot: it gave no answer")
    node.results = [Result(0, "carried\n", "")]
    with pytest.raises(LaunchError, match="snapshot: its answer was not JSON: carried$"):
        carry(cluster, tmp_path, "r2", {"n0": cast(Connection, node)}, ["n0"])
