"""The verbs' tests that need no sandbox: an inventory of two nodes on loopback, where
nothing listens on the SSH port, so a command that got as far as SSH would say "cannot
reach"; a bad input must be refused before that."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest


@pytest.fixture
def setup(tmp_path: Path) -> tuple[list[str], Path]:
    """`train`'s first words for that inventory, a work directory (job.py, pkg/train.py)
    and a runs directory; and the runs directory."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        "[train_nodes]\n"
        f"node0 ansible_host=127.0.0.1 ansible_port={port}\n"
        f"node1 ansible_host=127.0.0.2 ansible_port={port}\n"
        "[all:vars]\nansible_user=root\n"
        f"ansible_ssh_common_args='-o UserKnownHostsFile={tmp_path}/known_hosts'\n")
    work = tmp_path / "code"
    work.mkdir()
    (work / "job.py").write_text("print('hi')\n")
    (work / "pkg").mkdir()
    (work / "pkg" / "train.py").write_text("print('hi')\n")
    runs = tmp_path / "runs"
    return ["train", "-i", str(inventory), "--workdir", str(work), "--runs-dir", str(runs)], runs
