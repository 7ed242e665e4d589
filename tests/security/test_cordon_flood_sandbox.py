"""bob floods the share's cordon record, on the real-site sandbox: 3000 events of his own
(of one node, and of made-up ones) cost alice's `cordon` listing at most twice its time,
and a reason of his that would erase its line and print "no node is cordoned" reaches
alice's terminal with its escapes made visible. The rule: roles/slurm/files/cordon.py
(it reads the newest few events of each user; untrusted.py makes text visible)."""

from __future__ import annotations

import time

import pytest

from ..cluster import ProvisionedCluster
from ..orchestrator.run.test_real_site_sandbox import orchestrator
from .conftest import as_user

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(900)]
NODE = "node2"   # cordoned by bob for the test only
CORDONS = "/mnt/cluster/cordons"
FLOOD = ("import json, os, sys\n"
         "for i in range(3000):\n"
         "    node = 'fake%d' % (i % 1500) if i % 2 else sys.argv[1]\n"
         "    name = '%s/%s@%d@bob.json' % (sys.argv[2], node, 10**18 + i)\n"
         "    with open(name, 'w') as fh:\n"
         "        json.dump({'node': node, 'action': 'uncordon', 'why': 'flood'}, fh)\n")
ESCAPES = ("import json, sys, time\n"
           "name = '%s/%s@%d@bob.json' % (sys.argv[2], sys.argv[1], time.time_ns())\n"
           "with open(name, 'w') as fh:\n"
           "    json.dump({'node': sys.argv[1], 'action': 'cordon',\n"
           "               'why': '\\x1b[1A\\x1b[2K\\rno node is cordoned'}, fh)\n")


def alices_listing(cluster: ProvisionedCluster) -> tuple[float, str]:
    """The best time of three of alice's `cordon`, and its output."""
    best, said = float("inf"), ""
    for _ in range(3):
        started = time.monotonic()
        done = orchestrator("cordon", "-i", str(cluster.inventories["alice"]), timeout=300)
        best = min(best, time.monotonic() - started)
        assert done.returncode == 0, done.stdout + done.stderr
        said = done.stdout + done.stderr
    return best, said


def test_bobs_flood_of_events_costs_alices_listing_a_bounded_read(
        sandbox_cluster: ProvisionedCluster) -> None:
    before = {p.name for p in (sandbox_cluster.share / "cordons").iterdir()}
    try:
        alone, _ = alices_listing(sandbox_cluster)
        done = as_user(sandbox_cluster, "node0", "bob",
                       f"python3 - {NODE} {CORDONS}", stdin=FLOOD, timeout=600)
        assert done.returncode == 0, done.stderr
        flooded, said = alices_listing(sandbox_cluster)
        assert flooded <= 2 * alone, (alone, flooded)
        assert said.count("by bob") <= 2, said[-2000:]   # his flood said in a line
    finally:
        for name in {p.name for p in (sandbox_cluster.share / "cordons").iterdir()} - before:
            (sandbox_cluster.share / "cordons" / name).unlink()


def test_bobs_reason_reaches_alices_terminal_with_its_escapes_visible(
        sandbox_cluster: ProvisionedCluster) -> None:
    before = {p.name for p in (sandbox_cluster.share / "cordons").iterdir()}
    try:
        done = as_user(sandbox_cluster, "node0", "bob", f"python3 - {NODE} {CORDONS}",
                       stdin=ESCAPES)
        assert done.returncode == 0, done.stderr
        _, said = alices_listing(sandbox_cluster)
        assert "\x1b" not in said and "\r" not in said, repr(said)
        assert "\\x1b[1A\\x1b[2K\\x0dno node is cordoned" in said, said
        assert f"{NODE} " in said and " by bob: " in said, said
    finally:
        for name in {p.name for p in (sandbox_cluster.share / "cordons").iterdir()} - before:
            (sandbox_cluster.share / "cordons" / name).unlink()
