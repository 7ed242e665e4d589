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
from orchestrator.node.answers import CarryAnswer
from orchestrator.run.sync import (
    FIRST,
    NOT_REUSED,
    code_digest,
    reuse_and_carry,
    reuse_command,
    seal_and_carry,
    seal_command,
    sync_code,
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
    # No snapshot yet, or a latest link whose snapshot is gone: the first copy's.
    assert on_node(home, reuse_command("r1", "D1")) == FIRST
    root.mkdir(parents=True)
    (root / "latest").symlink_to("r0")
    assert on_node(home, reuse_command("r1", "D1")) == FIRST
    (root / "latest").unlink()
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
    assert seal_and_carry(cluster, work, "r1", "D1", clients, ["n0"])["n0"].from_ is None

    node.runs.clear()
    assert reuse_and_carry(cluster, work, "r2", "D2", clients) == {"n0": NOT_REUSED}
    assert not (root / "r2").exists() and len(node.runs) == 1

    node.runs.clear()
    found = reuse_and_carry(cluster, work, "r2", "D1", clients)["n0"]
    assert len(node.runs) == 1
    assert isinstance(found, CarryAnswer) and (found.from_, found.carried) == ("r1", [])
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
        seal_and_carry(cluster, tmp_path, "r2", "D1", {"n0": cast(Connection, node)}, ["n0"])


def test_an_edited_tree_is_sent_as_a_delta_against_the_latest_snapshot(tmp_path) -> None:
    """The edit-and-run loop: the node has a snapshot of other code; rsync sends only what
    changed over the node's connection (here a local remote shell, rsync as it runs), every
    unchanged file is a hard link to the latest snapshot, the new one becomes the latest,
    sealed: the next run of the same code is linked."""
    home = tmp_path / "n0"
    installed(home)
    root = home / ".clustertrain" / "code"
    work = code_tree(tmp_path / "work")
    (work / "lib.py").write_text("X = 1\n")
    root.mkdir(parents=True)
    subprocess.run(["cp", "-a", f"{work}/.", str(root / "r1")], check=True)
    (root / "latest").symlink_to("r1")
    assert on_node(home, seal_command("r1", "D1")) == 0
    cluster = Cluster(tmp_path / "hosts", (NodeSpec("n0", SshTarget("127.0.0.1"), "127.0.0.1",
                                                    python=sys.executable),))
    clients = {"n0": cast(Connection, LocalNode(home))}

    (work / "train.py").write_text("print('v2')\n")
    edited = sync_code(cluster, work, "r2", clients=clients)
    assert (edited.delta, edited.reused) == (["n0"], [])
    r1, r2 = root / "r1", root / "r2"
    assert (r2 / "train.py").read_text() == "print('v2')\n"
    assert (r2 / "lib.py").stat().st_ino == (r1 / "lib.py").stat().st_ino
    assert (r1 / "train.py").read_text() == "print('v1')\n"   # the old snapshot as it was
    assert not (r2 / "data" / "model.ckpt").exists()           # .gitignore'd
    assert os.readlink(root / "latest") == "r2"
    assert edited.carried["n0"].carried == []

    again = sync_code(cluster, work, "r3", clients=clients)
    assert (again.delta, again.reused) == ([], ["n0"])
    assert (root / "r3" / "train.py").stat().st_ino == (r2 / "train.py").stat().st_ino
