"""bob against root's walk of the share, on the real-site sandbox: while the share is nearly
full, root on its server (node0) walks the export and writes each user's bytes to
`health/users.json`, which preflight shows as the share's biggest users. bob swapped a
directory of his, once the walk had seen it, for a link to 64 MiB of alice's outside the
share, and the walk followed it: users.json said alice holds 64 MiB more on the share than
she does. Now the walk enters a directory only as the one it saw (health.walk: opened
without following a link, checked against its lstat).

bob's timing is exact, not a race he may lose: the walk goes depth first, from the end of
each listing, so the sibling listed just after his directory is walked just before it; bob
watches that sibling with inotify and swaps his directory the moment root opens the
sibling (which holds 3000 files, so that its listing outlasts the swap)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from orchestrator.node import health

from ..cluster import ProvisionedCluster
from .conftest import as_user

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]
NODE = "node0"   # the share's server (the nfs_server group)
EXPORT = "/srv/nfs/cluster"
BAIT = f"{EXPORT}/checkpoints/bob/walk-bait"
BIG = "/home/alice/not-on-the-share"
USERS = f"{EXPORT}/{health.HISTORY_SUBDIR}/{health.USERS}"
TRAP = """\
import ctypes, os, sys
bait, target = sys.argv[1], sys.argv[2]
os.makedirs(bait + "/d")
for i in range(30):
    os.mkdir("%s/s%02d" % (bait, i))
order = os.listdir(bait)
after = order.index("d") + 1
if after == len(order):
    print("no sibling after d", flush=True)
    sys.exit(3)
sibling = "%s/%s" % (bait, order[after])
for i in range(3000):
    open("%s/f%04d" % (sibling, i), "w").close()
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
IN_OPEN = 0x20
if fd < 0 or libc.inotify_add_watch(fd, sibling.encode(), IN_OPEN) < 0:
    print("inotify: errno %d" % ctypes.get_errno(), flush=True)
    sys.exit(4)
print("ready", flush=True)
os.read(fd, 4096)
os.rename(bait + "/d", bait + "/d.seen")
os.symlink(target, bait + "/d")
print("swapped", flush=True)
"""


def alices_bytes(cluster: ProvisionedCluster) -> int:
    """Root's count of the share, as the health check makes it while the share is nearly
    full (`health.py --users EXPORT MIN_FREE_GB NOW`, given a minimum no disk meets): alice's
    bytes in users.json."""
    cluster.exec(NODE, "rm", "-f", USERS)   # else a count of minutes ago stands
    done = cluster.exec(NODE, "python3", f"{health.LIB_DIR}/health.py", "--users", EXPORT,
                        "1000000", str(time.time()))
    assert json.loads(done.stdout) is True, done.stdout + done.stderr   # it walked
    return int(json.loads(cluster.exec(NODE, "cat", USERS).stdout)["users"].get("alice", 0))


def test_a_directory_bob_swaps_for_a_link_mid_walk_is_not_followed(
        sandbox_cluster: ProvisionedCluster) -> None:
    made = as_user(sandbox_cluster, NODE, "alice",
                   f"mkdir -p {BIG} && head -c 67108864 /dev/urandom > {BIG}/data")
    assert made.returncode == 0, made.stderr
    trap: subprocess.Popen | None = None
    try:
        before = alices_bytes(sandbox_cluster)
        trap = subprocess.Popen(
            ["podman", "exec", "-i", sandbox_cluster.containers[NODE], "runuser", "-l", "bob",
             "-c", f"python3 - {BAIT} {BIG}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        assert trap.stdin is not None and trap.stdout is not None
        trap.stdin.write(TRAP)
        trap.stdin.close()
        ready = trap.stdout.readline().strip()
        assert ready == "ready", (ready, trap.stderr.read() if trap.stderr else "")
        after = alices_bytes(sandbox_cluster)
        try:
            trap.wait(timeout=30)
        except subprocess.TimeoutExpired:
            trap.kill()   # still waiting: root never opened the sibling
            trap.wait()
        said = trap.stdout.read() + (trap.stderr.read() if trap.stderr else "")
        assert "swapped" in said, said   # bob's swap came while root walked
        assert after == before, (before, after)
    finally:
        if trap is not None and trap.poll() is None:
            trap.kill()
            trap.wait()
        sandbox_cluster.exec(NODE, "rm", "-rf", BAIT, BIG, USERS, check=False)
