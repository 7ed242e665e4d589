"""bob against the node's health check (roles/health, root's), on the real-site sandbox:
- a process of his named like a run's supervisor (`... node.py supervise --run ...`)
  counted as a run on the node, so a reboot asked of it (roles/nvidia_driver's, through
  `health.py --defer-reboot`) waited for it for ever. Now a supervisor counts only with its
  job directory's word for it (health.proven_run).
- his temporary files filling the node's /tmp failed the node's space check, and the node
  was cordoned (and drained) for everyone. Now the check warns, naming him, and cordons
  nothing; alice's preflight says who fills it.
Each runs on node2 and leaves it as it found it (its health config, state and cordons)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from orchestrator.node import health

from ..cluster import ProvisionedCluster, orchestrator
from ..roles.test_health_sandbox import check_now, drain_of
from .conftest import as_user

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]
NODE = "node2"
HEALTH = ["python3", f"{health.LIB_DIR}/health.py"]
PENDING = f"{health.STATE_DIR}/{health.REBOOT_PENDING}"
LOOKALIKE = ("python3 -c 'import time; time.sleep(900)' /home/bob/node.py supervise "
             "--job /home/bob/.clustertrain/jobs/r-bob-lookalike --run r-bob-lookalike "
             "-- torchrun train.py")


def cordons_of(cluster: ProvisionedCluster) -> set[str]:
    return {p.name for p in (cluster.share / "cordons").iterdir()}


def back_to_service(cluster: ProvisionedCluster, before: set[str]) -> None:
    """NODE as it was: no reboot asked, its check passing again (which lifts its cordon and
    returns it to Slurm), the events the test made gone."""
    cluster.exec(NODE, "rm", "-f", PENDING, check=False)
    check_now(cluster, NODE)
    for name in cordons_of(cluster) - before:
        (cluster.share / "cordons" / name).unlink()


def test_bobs_lookalike_supervisor_holds_off_no_reboot(
        sandbox_cluster: ProvisionedCluster) -> None:
    before = cordons_of(sandbox_cluster)
    started = as_user(sandbox_cluster, NODE, "bob",
                      f"setsid {LOOKALIKE} </dev/null >/dev/null 2>&1 & echo $!")
    assert started.returncode == 0, started.stderr
    pid = started.stdout.split()[-1]
    try:
        asked = sandbox_cluster.exec(NODE, *HEALTH, "--defer-reboot",
                                     "test: a new kernel module")
        running = json.loads(asked.stdout.strip().splitlines()[-1])["running"]
        assert not [r for r in running if "r-bob-lookalike" in r], running
    finally:
        as_user(sandbox_cluster, NODE, "bob", f"kill {shlex.quote(pid)}")
        back_to_service(sandbox_cluster, before)


FREE_TMP = "python3 -c 'import os; s = os.statvfs(\"/tmp\"); print(s.f_bavail * s.f_frsize)'"


def test_bob_filling_tmp_is_named_and_the_node_stays_in_service(
        sandbox_cluster: ProvisionedCluster) -> None:
    """The sandbox's disks have gigabytes free: the node's limit is raised instead (its
    health config, as an admin sets cluster_min_free_gb), to 32 MiB below what /tmp has
    free, and bob writes 96 MiB there: /tmp is 64 MiB short, and his files hold more."""
    raw = sandbox_cluster.exec(NODE, "cat", health.CONFIG).stdout   # put back byte for byte
    before = cordons_of(sandbox_cluster)
    free = int(sandbox_cluster.exec(NODE, "sh", "-c", FREE_TMP).stdout)
    limit = (free - 32 * 2**20) / 2**30
    config = {**json.loads(raw), "min_free_gb": limit, "places": ["/tmp"]}
    sandbox_cluster.exec(NODE, "sh", "-c", f"cat > {health.CONFIG} <<'EOF'\n"
                         f"{json.dumps(config)}\nEOF")
    try:
        filled = as_user(sandbox_cluster, NODE, "bob",
                         "head -c 100663296 /dev/urandom > /tmp/bobs-fill")
        assert filled.returncode == 0, filled.stderr
        said = check_now(sandbox_cluster, NODE)
        assert said.startswith(f"{NODE}: healthy; warning: /tmp has "), said
        assert re.search(r"filled by temporary files \(/tmp, /var/tmp, /dev/shm\) of "
                         r"(\S+ \S+ GiB, )*bob 0\.\d\d GiB", said), said
        assert "(cordoned)" not in said, said
        assert cordons_of(sandbox_cluster) == before
        assert "clustertrain (health check)" not in drain_of(sandbox_cluster, NODE)
        view = orchestrator("preflight", "-i", str(sandbox_cluster.inventories["alice"]),
                            "--hosts", f"node0,{NODE}", timeout=300)
        assert re.search(rf"{NODE}: /tmp has .* of (\S+ \S+ GiB, )*bob 0\.\d\d GiB",
                         view.stdout), view.stdout[-3000:] + view.stderr[-2000:]
        assert f"{NODE}: cordoned" not in view.stdout, view.stdout[-3000:]
    finally:
        as_user(sandbox_cluster, NODE, "bob", "rm -f /tmp/bobs-fill")
        sandbox_cluster.exec(NODE, "sh", "-c", f"printf '%s' {shlex.quote(raw)} > "
                             f"{health.CONFIG}", check=False)
        back_to_service(sandbox_cluster, before)
