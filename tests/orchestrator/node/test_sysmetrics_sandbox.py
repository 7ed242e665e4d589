"""System metrics for a script that prints nothing, on two real sandbox nodes: each
node's supervisor samples its node every 10 s while the run lives, the controller keeps
the samples in timeline.jsonl (not on the terminal, not in the run's logs), and
report.html charts every node's CPU, memory, the job's memory and the cluster interface's
traffic, and the GPUs of nvidia-smi's test double put on the nodes' PATH by this test.

The GPU-idle flag needs 3 minutes of idle samples (GPU_IDLE_S), longer than this run: its
rule is tested on samples (tests/orchestrator/diagnosis/test_system.py), and its saying
and reporting with the memory flag's (tests/orchestrator/run/test_follow.py,
tests/orchestrator/report/test_page.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.record.rundir import RunDir
from orchestrator.report.page import read_system

from ...cluster import ProvisionedCluster as Sandbox
from ..report.browser import dom, series
from ..run.test_train_sandbox import Train
from .test_sysmetrics import SMI_BIN

pytestmark = [pytest.mark.sandbox, pytest.mark.e2e, pytest.mark.timeout(1500)]

# Holds 64 MiB, prints nothing, lives 35 s: three samples per node.
QUIET = ("import time\n"
         "held = bytearray(64 << 20)\n"
         "held[::4096] = b'x' * len(held[::4096])\n"
         "time.sleep(35)\n")
# The nodes' own PATH, after the test double's directory (relative: the job's working
# directory on the node is its code snapshot, which carries doubles/).
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NODES = ["node0", "node1"]


def test_a_quiet_scripts_report_charts_every_nodes_system_metrics(
        sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "quiet.py").write_text(QUIET)
    shutil.copytree(SMI_BIN, work / "doubles")
    t = Train(sandbox_cluster, tmp_path / "runs", "--workdir", str(work), "--nodes", "2",
              "--env", f"PATH=doubles:{NODE_PATH}", "quiet.py")
    code = t.finish()
    assert code == 0, t.text[-3000:] + t.stderr
    summary = t.summary()
    run = RunDir(tmp_path / "runs", summary["run_id"])
    assert "@@clustertrain" not in t.text, t.text
    for node in NODES:
        assert "@@clustertrain" not in run.log(node).read_text()
    samples = read_system(run)
    for node in NODES:
        mine = [s for s in samples if s.node == node]
        assert len(mine) >= 3, samples
        for s in mine:
            assert s.cpu_pct is not None and 0 <= s.cpu_pct <= 100
            assert s.mem_total and s.mem_available and 0 < s.mem_available < s.mem_total
            assert s.job_rss is not None and s.job_rss > 64 << 20   # torchrun + the script
            assert s.rx_bps is not None and s.tx_bps is not None    # eth0: the ring's beats
            assert [(g.index, g.util_pct) for g in s.gpus] == [(0, 0.0), (1, 0.0)]
    assert max(s.tx_bps or 0 for s in samples) > 0
    elements = dom(run.report_html)
    for chart in ("cpu", "memory", "rss", "net-in", "net-out"):
        assert sorted(series(elements, chart)) == NODES, chart
    assert sorted(series(elements, "gpu-util")) == [f"{n} GPU {i}" for n in NODES
                                                    for i in (0, 1)]
