"""The wheel-installed tool does a user's work from `/`: a sandbox up and down, and
provisioning the shared cluster with the playbooks and roles inside the wheel."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

pytestmark = pytest.mark.sandbox


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """provision's RECAP: {host: {"ok": n, "changed": n, ...}}."""
    lines = stdout.rpartition("\nRECAP\n")[2].splitlines()
    return {m[1]: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m[2])}
            for m in (re.match(r"\s+(\S+)\s+(ok=.*)", line) for line in lines) if m}


@pytest.mark.own_sandbox
def test_a_sandbox_comes_up_and_goes_down_with_the_installed_tool(installed_tool, sandbox_name):
    name = sandbox_name("pkg")
    up = installed_tool.run("clustertrain", "sandbox", "up", "--nodes", "1", "--name", name,
                            "--json", timeout=900)
    assert up.returncode == 0, up.stderr[-3000:]
    info = json.loads(up.stdout)
    assert [n["name"] for n in info["nodes"] if not n["outsider"]] == ["node0"]
    # The sandbox's own settings (the wheel's sandbox/group_vars) are in its inventory.
    assert "nfs_server_implementation: ganesha" in open(info["inventory"]).read()
    status = installed_tool.run("clustertrain", "sandbox", "status", "--name", name, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["name"] == name

    down = installed_tool.run("clustertrain", "sandbox", "down", "--name", name, timeout=300)
    assert down.returncode == 0, down.stderr
    gone = installed_tool.run("clustertrain", "sandbox", "status", "--name", name)
    assert gone.returncode != 0 and name in gone.stderr, gone.stdout + gone.stderr
    for node in info["nodes"]:
        exists = subprocess.run(["podman", "container", "exists", node["container"]],
                                capture_output=True, timeout=60)
        assert exists.returncode == 1, node   # 1: no such container


@pytest.mark.long
def test_the_installed_tool_provisions_the_shared_cluster_again_without_change(
        installed_tool, sandbox_cluster):
    """site.yml run again, as `provision` runs it (`make demo` provisions with it): task by
    task as it goes, then a recap in which no host changed. The one re-run of the whole
    site.yml on the shared cluster (tests/e2e re-runs it after a node's restart)."""
    proc = installed_tool.run("clustertrain", "provision", "-i", str(sandbox_cluster.inventory),
                              timeout=1200)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    assert "TASK " in proc.stdout  # progress, task by task
    counts = recap(proc.stdout)
    assert set(counts) == set(sandbox_cluster.nodes), proc.stdout[-3000:]
    assert all(c["changed"] == 0 and c["failed"] == 0 for c in counts.values()), counts
