"""Unchanged code is not synced again: the local digest, and the node-side shell that seals a
snapshot and links the next one from it, run here with a real sh, find and cp."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from orchestrator.run.sync import code_digest, reuse_command, seal_command


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
