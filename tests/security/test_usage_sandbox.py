"""bob against `usage`, on the real-site sandbox: the GPU-hours he writes into records in
another user's name (carol, who has none, and a look-alike of alice with a Cyrillic "а")
count for nobody and are said with their owner, bob; the pipe and the link to /dev/zero he
plants among his own records neither hang alice's `usage --all` (she is an admin) nor
are read without end. The rule: orchestrator/node/usage.py (untrusted.py reads)."""

from __future__ import annotations

import json
import time

import pytest

from ..cluster import ProvisionedCluster
from ..orchestrator.run.test_real_site_sandbox import orchestrator
from .conftest import as_user

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]
TOP = "/mnt/cluster/checkpoints"
LOOK_ALIKE = "\u0430lice"   # a Cyrillic а, then "lice"


def plant(cluster: ProvisionedCluster) -> None:
    """bob's forged records (512 GPUs for nine hours, ending a minute ago), a pipe and a
    link to /dev/zero among his own."""
    now = time.time()
    state = json.dumps({"node": "node0", "user": "x", "started": now - 9 * 3600,
                        "ended": now - 60, "gpus": 512})
    script = (f"set -e; for u in carol {LOOK_ALIKE}; do d={TOP}/$u/.clustertrain/runs/f1; "
              f"mkdir -p $d; printf '%s' '{state}' > $d/node0.json; done; "
              f"d={TOP}/bob/.clustertrain/runs/trap; mkdir -p $d; mkfifo $d/node0.json; "
              f"ln -s /dev/zero $d/node1.json")
    done = as_user(cluster, "node0", "bob", script)
    assert done.returncode == 0, done.stderr


def test_bobs_hours_in_others_names_count_for_nobody_and_his_traps_hang_nothing(
        sandbox_cluster: ProvisionedCluster) -> None:
    plant(sandbox_cluster)
    try:
        since = time.strftime("%Y-%m-%dT%H:%M", time.localtime(time.time() - 86400))
        started = time.monotonic()
        admin = orchestrator("usage", "--since", since, "--all", "--json", "-i",
                             str(sandbox_cluster.inventories["alice"]), timeout=300)
        took = time.monotonic() - started
        assert admin.returncode == 0, admin.stdout + admin.stderr
        assert took < 120, took   # not the 30 minutes of a pipe's wait
        found = json.loads(admin.stdout)
        assert not {"carol", LOOK_ALIKE} & set(found["users"]), found["users"]
        assert all(r["run"] not in ("f1", "trap") for r in found["runs"]), found["runs"]
        refused = {r["path"]: r for r in found["refused"]}
        for user in ("carol", "\\u0430lice"):
            path = f"{TOP}/{user}/.clustertrain/runs/f1/node0.json"
            assert refused[path]["owner"] == "bob" and "its owner is bob" in \
                refused[path]["why"], found["refused"]
        trap = f"{TOP}/bob/.clustertrain/runs/trap"
        assert refused[f"{trap}/node0.json"]["why"].startswith("not a regular file")
        assert refused[f"{trap}/node1.json"]["why"] == "a symbolic link: not followed"
        mine = orchestrator("usage", "--since", since, "--json", "-i",
                            str(sandbox_cluster.inventories["bob"]), timeout=300)
        assert mine.returncode == 0, mine.stdout + mine.stderr
        assert not {"carol", LOOK_ALIKE} & set(json.loads(mine.stdout)["users"])
    finally:
        as_user(sandbox_cluster, "node0", "bob", f"rm -rf {TOP}/carol {TOP}/{LOOK_ALIKE} "
                f"{TOP}/bob/.clustertrain/runs/trap")
