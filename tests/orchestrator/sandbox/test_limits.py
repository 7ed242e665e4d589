"""Host limits checked before a sandbox is created."""

from __future__ import annotations

import ctypes
import os

import pytest

from orchestrator.errors import SandboxError
from orchestrator.sandbox.limits import INOTIFY_PER_CONTAINER, check_inotify, inotify_in_use


def test_counts_the_inotify_instances_this_user_holds(tmp_path):
    """Counted in this process only (a /proc that lists it alone): the user's other
    processes, a sandbox booting beside the tests, change their own counts meanwhile."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / str(os.getpid())).symlink_to(f"/proc/{os.getpid()}")
    (proc / "self").symlink_to("/proc/self")   # not a PID: skipped
    libc = ctypes.CDLL(None, use_errno=True)
    before = inotify_in_use(proc=proc)
    fds = [libc.inotify_init() for _ in range(3)]
    try:
        assert all(fd >= 0 for fd in fds)
        assert inotify_in_use(proc=proc) == before + 3
        assert inotify_in_use(uid=os.getuid() + 1, proc=proc) == 0  # another user's
        assert inotify_in_use() >= before + 3  # the real /proc counts them too
    finally:
        for fd in fds:
            os.close(fd)
    assert inotify_in_use(proc=proc) == before


def test_a_sandbox_that_fits_passes():
    check_inotify(17, in_use=0, limit=128)  # 16 nodes and a bastion: what the benchmarks use


def test_a_sandbox_past_the_limit_names_the_sysctl_and_the_other_way_out():
    with pytest.raises(SandboxError) as err:
        check_inotify(17, in_use=80, limit=128)   # a second 16-node sandbox beside one
    msg = str(err.value)
    assert f"17 containers need about {17 * INOTIFY_PER_CONTAINER} inotify instances" in msg
    assert "80 of this user's 128 (fs.inotify.max_user_instances)" in msg
    assert "sysctl -w fs.inotify.max_user_instances=1024" in msg
    assert "sandbox list" in msg
