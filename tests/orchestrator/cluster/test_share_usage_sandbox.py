"""`clustertrain du` and `usage` on the real share, as two real users: bob sees his own
bytes and runs, and that alice's directory is not his to read; alice, an admin, sees
everyone's with --all (as root, through sudo), which bob is refused."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from ...cluster import ProvisionedCluster, orchestrator
from ..run.test_train_sandbox import JOBS

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]


def test_du_shows_each_user_their_own_and_an_admin_everyones(
        sandbox_cluster: ProvisionedCluster) -> None:
    bob = sandbox_cluster.inventories["bob"]
    name = f"du-{secrets.token_hex(3)}"
    mine, hers = (f"/mnt/cluster/checkpoints/{u}/{name}" for u in ("bob", "alice"))
    for user, path, mib in (("bob", mine, 6), ("alice", hers, 2)):
        sandbox_cluster.exec("node1", "runuser", "-u", user, "--", "sh", "-ec",
                             f"mkdir -p {path} && head -c {mib}M /dev/urandom > {path}/step.pt")
    try:
        as_bob = orchestrator("du", "--json", "-i", str(bob), timeout=300)
        assert as_bob.returncode == 0, as_bob.stdout + as_bob.stderr
        seen = json.loads(as_bob.stdout)
        assert seen["users"]["bob"]["checkpoints"] >= 6 << 20, seen["users"]
        unread = {u["path"]: u["owner"] for u in seen["unread"]}
        assert unread.get("/mnt/cluster/checkpoints/alice") == "alice", seen["unread"]
        shown = orchestrator("du", "-i", str(bob), timeout=300)
        assert "not read: /mnt/cluster/checkpoints/alice (owned by alice): Permission " \
            "denied; an admin sees it with du --all" in shown.stdout, shown.stdout

        refused = orchestrator("du", "--all", "-i", str(bob), timeout=300)
        assert refused.returncode != 0
        assert "du --all reads every user's directories as root, through sudo on node0, " \
            "which refused" in refused.stderr, refused.stderr

        admin = orchestrator("du", "--all", "--json", "-i", str(sandbox_cluster.inventory),
                             timeout=300)
        assert admin.returncode == 0, admin.stdout + admin.stderr
        everyone = json.loads(admin.stdout)
        assert everyone["unread"] == [], everyone["unread"]
        assert everyone["users"]["bob"]["checkpoints"] >= 6 << 20
        assert everyone["users"]["alice"]["checkpoints"] >= 2 << 20   # unread by bob
        assert everyone["total"] > everyone["free"] > 0
    finally:
        sandbox_cluster.exec("node1", "rm", "-rf", mine, hers, check=False)


def test_usage_counts_a_real_queued_run_for_its_user_and_an_admin(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """bob's 2-node run through Slurm's queue with a GPU per node (Slurm's fake GPUs):
    `usage` gives him its node- and GPU-hours, and alice's records are not his to read;
    alice's `usage --all` has his run too."""
    bob = sandbox_cluster.inventories["bob"]
    since = time.strftime("%Y-%m-%dT%H:%M", time.localtime(time.time() - 60))
    ran = orchestrator("train", "-i", str(bob), "--queue", "--nodes", "2", "--gpus-per-node",
                       "1", "--workdir", str(JOBS), "--runs-dir", str(tmp_path / "runs"),
                       "ddp_allreduce.py", "--", "--steps", "1", timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    [summary] = (tmp_path / "runs").glob("*/summary.json")
    run_id = json.loads(summary.read_text())["run_id"]

    mine = orchestrator("usage", "--since", since, "--json", "-i", str(bob), timeout=300)
    assert mine.returncode == 0, mine.stdout + mine.stderr
    found = json.loads(mine.stdout)
    [run] = [r for r in found["runs"] if r["run"] == run_id]
    assert run["user"] == "bob" and sorted(run["nodes"]) == ["node0", "node1"], run
    # Each node's part lasted a few seconds; with one GPU each, GPU-hours equal node-hours.
    assert 0 < run["node_hours"] < 0.1 and run["gpu_hours"] == run["node_hours"], run
    assert "alice" not in found["users"], found["users"]
    assert {u["path"]: u["owner"] for u in found["unread"]}.get(
        "/mnt/cluster/checkpoints/alice") == "alice", found["unread"]

    admin = orchestrator("usage", "--since", since, "--all", "--runs", "-i",
                         str(sandbox_cluster.inventory), timeout=300)
    assert admin.returncode == 0, admin.stdout + admin.stderr
    assert any(line.split()[:3] == [run_id, "bob", "2"] for line in admin.stdout.splitlines()), \
        admin.stdout
    assert "not read" not in admin.stdout


def test_a_runs_old_records_are_folded_by_the_next_run_and_still_counted(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """bob's 2-node run that ended 40 days ago (its records written by him on the share and
    backdated): his next run's start folds it into his usage ledger (node/fold.py, node 0's
    supervisor) and removes its directory; `usage` over a window reaching back to it counts
    its 4 node-hours still, now from the ledger, by the day."""
    bob = sandbox_cluster.inventories["bob"]
    day = 86400.0
    start = time.time() - 40 * day
    end = start + 2 * 3600
    old = f"old-{secrets.token_hex(3)}"
    where = f"/mnt/cluster/checkpoints/bob/.clustertrain/runs/{old}"
    states = {n: json.dumps({"node": n, "user": "bob", "state": "ended", "code": 0,
                             "started": start, "ended": end, "time": end, "gpus": 1})
              for n in ("node0", "node1")}
    parts = " && ".join(f"printf '%s' '{state}' > {where}/{n}.json"
                        for n, state in states.items())

    def as_bob(script: str) -> subprocess.CompletedProcess:   # the share squashes root
        return sandbox_cluster.exec("node1", "runuser", "-u", "bob", "--", "sh", "-ec", script,
                                    check=False)

    made = as_bob(f"umask 077 && mkdir -p {where} && {parts} && touch -d @{end:.0f} "
                  f"{where}/node0.json {where}/node1.json {where}")
    assert made.returncode == 0, made.stderr
    since = time.strftime("%Y-%m-%d", time.localtime(start - 2 * day))

    def bobs() -> dict:
        seen = orchestrator("usage", "--since", since, "--json", "-i", str(bob), timeout=300)
        assert seen.returncode == 0, seen.stdout + seen.stderr
        return json.loads(seen.stdout)

    before = bobs()
    [counted] = [r for r in before["runs"] if r["run"] == old]
    assert counted["node_hours"] == 4.0 and counted["gpu_hours"] == 4.0, counted
    folded_before = (before["ledger"].get("bob") or {}).get("node_hours", 0.0)

    ran = orchestrator("train", "-i", str(bob), "--nodes", "2", "--workdir", str(JOBS),
                       "--runs-dir", str(tmp_path / "runs"), "ddp_allreduce.py", "--",
                       "--steps", "1", timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    deadline = time.monotonic() + 60   # the fold runs beside the run, not before it
    while as_bob(f"test -e {where}").returncode == 0:
        assert time.monotonic() < deadline, f"{where} was not folded by the next run"
        time.sleep(2)

    after = bobs()
    assert old not in {r["run"] for r in after["runs"]}, after["runs"]
    ledger = after["ledger"]["bob"]
    assert abs(ledger["node_hours"] - (folded_before + 4.0)) < 0.01, (before, after)
    assert ledger["first_day"] <= time.strftime("%Y-%m-%d", time.gmtime(start)) \
        <= ledger["last_day"], ledger
    assert after["users"]["bob"]["node_hours"] >= before["users"]["bob"]["node_hours"], after
    ledger_file = as_bob("stat -c '%U %a' /mnt/cluster/checkpoints/bob/.clustertrain/"
                         "usage-ledger.json")
    assert ledger_file.stdout.split() == ["bob", "600"], ledger_file.stdout + ledger_file.stderr
