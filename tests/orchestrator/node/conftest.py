"""What the node package's tests share."""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.node import cordon


@pytest.fixture
def open_share() -> Iterator[str]:
    """A share every user reaches, its cordon records' directory open to all as on the
    cluster (pytest's tmp_path is root's alone)."""
    root = tempfile.mkdtemp(prefix="cordon-share-")
    os.chmod(root, 0o755)
    os.mkdir(os.path.join(root, cordon.CORDONS_SUBDIR))
    os.chmod(os.path.join(root, cordon.CORDONS_SUBDIR), 0o1777)
    try:
        yield root
    finally:
        shutil.rmtree(root)


SHM = Path("/dev/shm")
SHM_LOCK = "/tmp/clustertrain-tests-dev-shm.lock"


@pytest.fixture
def shm_share() -> Iterator[Path]:
    """/dev/shm as a stand-in share (a tmpfs mount point) with checkpoints/ as the
    nfs_server role makes it (sticky, writable by all). One test at a time holds it, across
    pytest's workers (a lock): two at once saw each other's checkpoints/."""
    if not os.path.ismount(SHM):
        pytest.skip("/dev/shm is not a mount point on this machine")
    with open(SHM_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (SHM / "checkpoints").exists():
            pytest.fail(f"{SHM}/checkpoints is there already (left by a test run that was "
                        "killed?): remove it")
        (SHM / "checkpoints").mkdir()
        (SHM / "checkpoints").chmod(0o1777)
        try:
            yield SHM
        finally:
            shutil.rmtree(SHM / "checkpoints", ignore_errors=True)


PEOPLE = ("alice", "bob")


@pytest.fixture(scope="module")
def people() -> Iterator[None]:
    """alice and bob, real users of this machine (made here when missing, removed after)."""
    if os.geteuid() != 0:
        pytest.skip("records of other owners need root")
    made = []
    for name in PEOPLE:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name],
                           check=True, capture_output=True)
            made.append(name)
    yield
    for name in made:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def give(path: Path, owner: str, top: Path) -> None:
    """PATH and every directory above it up to TOP, OWNER's."""
    pw = pwd.getpwnam(owner)
    while path != top:
        os.lchown(path, pw.pw_uid, pw.pw_gid)
        path = path.parent
