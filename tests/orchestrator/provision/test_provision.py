"""`python -m orchestrator provision` (what `make demo` provisions with) against the
session's sandbox, already provisioned by site.yml: a re-run changes nothing and says so
host by host; a bad inventory is refused before anything runs."""

from __future__ import annotations

import re

import pytest

from ...cluster import ProvisionedCluster, orchestrator


@pytest.mark.sandbox
@pytest.mark.timeout(1500)
def test_provision_again_changes_nothing_and_prints_a_recap(sandbox_cluster: ProvisionedCluster):
    p = orchestrator("provision", "-i", str(sandbox_cluster.inventory))
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "TASK " in p.stdout  # progress, task by task
    recap = p.stdout[p.stdout.rindex("RECAP"):]
    rows = dict(re.findall(r"^\s+(\S+)\s+ok=\d+ changed=(\d+) failed=0 unreachable=0", recap,
                           re.M))
    assert set(rows) >= {"node0", "node1"}, recap
    assert all(v == "0" for v in rows.values()), recap


def test_provision_refuses_a_missing_inventory(tmp_path) -> None:
    missing = tmp_path / "nope.yml"
    p = orchestrator("provision", "-i", str(missing))
    assert p.returncode != 0
    assert f"inventory {missing} does not exist" in p.stderr, p.stderr
    assert "TASK " not in p.stdout
