"""`doctor` on the 3-node sandbox (real SSH through the bastion, torchrun with gloo across
three containers, real TCP between them): a node whose egress is throttled by tc is named
alone, with its links at the throttled rate, and `train --doctor` refuses to start on it;
a healthy cluster names nobody and `train --doctor` goes on to train."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ...cluster import ProvisionedCluster as Sandbox
from ..report.browser import dom, marked_rows, screenshot
from ..run.test_real_site_sandbox import orchestrator
from ..run.test_supervision_sandbox import cli
from ..run.test_train_sandbox import Train, assert_no_job_processes

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(900)]
NODES = ("node0", "node1", "node2")
RATE_GBIT = 0.2
# Half the default traffic per link and a quarter of the default all_reduce: at 200 Mbit/s
# node1's links still carry 12 MB each way (read as 0.192 Gbit/s, as with a whole second)
# and the all_reduce 4 MB a round; each of the test's three doctor runs is about 6 s shorter.
QUICK = ("--link-seconds", "0.5", "--allreduce-mb", "4")


@pytest.fixture
def node1_throttled(sandbox_cluster: Sandbox) -> Iterator[None]:
    """node1's packets out leave at 200 Mbit/s (a token bucket on its eth0)."""
    sandbox_cluster.exec("node1", "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                         f"{RATE_GBIT * 1000:g}mbit", "burst", "64kb", "latency", "200ms")
    try:
        yield
    finally:   # the test may have lifted it already
        sandbox_cluster.exec("node1", "tc", "qdisc", "del", "dev", "eth0", "root", check=False)


@pytest.mark.long
def test_a_node_with_throttled_egress_is_named_alone(sandbox_cluster: Sandbox,
                                                     tmp_path: Path,
                                                     node1_throttled: None) -> None:
    try:
        named_and_drained(sandbox_cluster, tmp_path)
        # Fixed: a clean doctor on the cordoned node returns it (alice is an admin: on
        # Slurm, returning a node is an admin's).
        sandbox_cluster.exec("node1", "tc", "qdisc", "del", "dev", "eth0", "root")
        clean = cli(sandbox_cluster, tmp_path, "doctor", "-i", str(sandbox_cluster.inventory),
                    "--nodes", "3", "--json", *QUICK)
        again = json.loads(clean.stdout)
        # Two shared cores make the matrix products noisy: doctor may name another node
        # now and then (which it cordons); node1, unless named again, is returned.
        named = [s["node"] for s in again["suspects"]]
        assert clean.returncode == (1 if named else 0), clean.stderr[-3000:]
        if "node1" not in named:
            assert again["uncordoned"] == ["node1"], again
            assert "node1 is uncordoned (clean doctor run" in clean.stderr, clean.stderr
        listed = orchestrator("cordon", "-i", str(sandbox_cluster.inventory))
        cordoned = [line.split()[0] for line in listed.stdout.splitlines()]
        assert cordoned == (sorted(named) or ["no"]), listed.stdout + listed.stderr
    finally:   # the later tests' runs through Slurm's queue may use every node again
        uncordon_all(sandbox_cluster)


def named_and_drained(sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    done = cli(sandbox_cluster, tmp_path, "doctor", "-i", str(sandbox_cluster.inventory),
               "--nodes", "3", "--json", *QUICK)
    assert done.returncode == 1, done.stderr[-3000:]   # 1: a suspect was named
    report = json.loads(done.stdout)
    assert [s["node"] for s in report["suspects"]] == ["node1"], report["suspects"]
    assert report["suspects"][0]["why"].startswith("sends at 0.")
    # The cluster runs Slurm: the next allocations avoid node1, for doctor's reason.
    assert list(report["drained"]) == ["node1"], report
    assert list(report["cordoned"]) == ["node1"], report
    assert "node1 is cordoned (node1 named by doctor" in done.stderr, done.stderr[-3000:]
    assert "node1 is drained in Slurm" in done.stderr, done.stderr[-3000:]
    state = sandbox_cluster.exec("node0", "sinfo", "-h", "-n", "node1", "-o", "%t %E").stdout
    assert re.match(r"drain\*? clustertrain \(alice\): node1 named by doctor \(run "
                    f"{report['run_id']}\\): sends at 0.", state), state
    links = {(lk["src"], lk["dst"]): lk["gbit_s"] for lk in report["links"]}
    assert set(links) == {(a, b) for a in NODES for b in NODES if a != b}
    for (src, _), gbit in links.items():   # near the rate from node1, well above it else
        assert (0.5 * RATE_GBIT < gbit < 1.2 * RATE_GBIT) if src == "node1" \
            else gbit > 3 * RATE_GBIT, links
    assert all(lk["latency_ms"] > 0 for lk in report["links"])
    assert report["allreduce"]["backend"] == "gloo" and report["allreduce"]["ranks"] == 3
    # kept like a run: its logs, its summary and the analysis
    run = tmp_path / report["run_id"]
    assert json.loads((run / "doctor.json").read_text())["suspects"] == report["suspects"]
    assert json.loads((run / "summary.json").read_text())["status"] == "succeeded"
    # Its report's heatmap has node1's row slow and marked.
    screenshot(run / "report.html", "sandbox-doctor")
    elements = dom(run / "report.html")
    assert marked_rows(elements) == ["node1"]
    cells = [e.attrs for e in elements if e.tag == "rect" and e.has_class("cell")]
    rows = {n: max(float(c["data-value"]) for c in cells if c["data-src"] == n) for n in NODES}
    assert min(rows, key=rows.__getitem__) == "node1", rows
    assert_no_job_processes(sandbox_cluster, NODES, within=10)

    t = Train(sandbox_cluster, tmp_path, "--nodes", "3", "--doctor", *QUICK,
              "ddp_allreduce.py", "--", "--steps", "2")
    assert t.finish(timeout=300) == 1
    assert "names node1: sends at" in t.stderr and "Nothing was started" in t.stderr, t.stderr
    assert "--ignore-suspects" in t.stderr
    assert "starting torchrun" in t.text          # doctor's own run
    assert t.text.count("starting torchrun") == 1  # and not the training
    assert_no_job_processes(sandbox_cluster, NODES, within=10)


def test_a_healthy_cluster_names_nobody_and_train_doctor_trains(sandbox_cluster: Sandbox,
                                                               tmp_path: Path) -> None:
    try:
        t = Train(sandbox_cluster, tmp_path, "--nodes", "3", "--doctor", "ddp_allreduce.py",
                  "--", "--steps", "2")
        code = t.finish(timeout=300)
        assert code == 0, t.text[-3000:] + t.stderr
    finally:   # a node named by mistake is cordoned: the later tests need every node
        uncordon_all(sandbox_cluster)
    assert "suspects: none" in t.text
    assert "##clustertrain record" not in t.text   # doctor's results: in its log only
    runs = sorted((p for p in tmp_path.iterdir() if (p / "summary.json").exists()),
                  key=lambda p: p.name)
    assert [(p / "doctor.json").exists() for p in runs] == [True, False]  # doctor, train
    assert json.loads((runs[0] / "doctor.json").read_text())["suspects"] == []
    assert json.loads((runs[1] / "summary.json").read_text())["status"] == "succeeded"


def uncordon_all(sandbox_cluster: Sandbox) -> None:
    for node in NODES:
        back = orchestrator("uncordon", node, "-i", str(sandbox_cluster.inventory))
        assert back.returncode == 0, back.stdout + back.stderr
