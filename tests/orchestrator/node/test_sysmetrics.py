"""A node's system metrics (orchestrator/node/sysmetrics.py): the parsers against this
machine's own /proc and against text as the kernel and nvidia-smi write it, the sampler
on this machine (nvidia-smi's test double on PATH for the GPUs), and the supervisor's own
lines in the job's output, which are not the job's progress for the hang watch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.node import sysmetrics, util
from orchestrator.node.protocol import SYSTEM_MARKER
from orchestrator.node.supervise import _quiet_for

SMI_BIN = Path(__file__).resolve().parent / "nvidia_smi" / "bin"

# As the kernel writes them (a container's /proc/net/route and /proc/net/dev).
ROUTE = """\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
podman1\t0000590A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
"""
NET_DEV = (  # the kernel pads the columns with more spaces
    "Inter-|   Receive                            |  Transmit\n"
    " face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop "
    "fifo colls carrier compressed\n"
    "    lo: 73407428327 1707907 0 0 0 0 0 0 73407428327 1707907 0 0 0 0 0 0\n"
    "  eth0: 21411698763  590036 0 0 0 0 0 0 27348010  304131 0 0 0 0 0 0\n")


def test_cpu_and_memory_of_this_machine_and_as_the_kernel_writes_them() -> None:
    busy, total = sysmetrics.parse_cpu(Path("/proc/stat").read_text())
    assert 0 < busy < total
    mem_total, available = sysmetrics.parse_meminfo(Path("/proc/meminfo").read_text())
    assert 0 < available < mem_total
    # user nice system idle iowait irq softirq steal: idle and iowait are not busy
    assert sysmetrics.parse_cpu("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n") == (150, 1000)
    assert sysmetrics.parse_meminfo("MemTotal:  1000 kB\nMemFree: 10 kB\n"
                                    "MemAvailable:   250 kB\n") == (1024000, 256000)
    with pytest.raises(ValueError):
        sysmetrics.parse_meminfo("MemTotal:  1000 kB\n")


def test_the_jobs_memory_is_its_whole_process_tree() -> None:
    # A command's name may hold spaces and parentheses.
    pid, proc = util.parse_stat(
        "4242 (python (rank 0)) S 4200 4242 4242 0 -1 4194560 1 0 0 0 5 1 0 0 20 0 3 0 "
        "100 123456 789 18446744073709551615")
    assert (pid, proc.ppid, proc.rss_pages) == (4242, 4200, 789)
    stats = {pid: util.Proc("S", ppid, pid, pages) for pid, ppid, pages in
             [(1, 0, 5), (10, 1, 100), (11, 10, 200), (12, 11, 300), (20, 1, 7000)]}
    assert sysmetrics.tree_rss(stats, 10, 4096) == 600 * 4096   # not its parent, not 20
    # Once the job's root has ended: no figure, not a job holding 0 bytes.
    assert sysmetrics.tree_rss(stats, 99, 4096) is None
    stats[10] = util.Proc("Z", 1, 10, 0)
    assert sysmetrics.tree_rss(stats, 10, 4096) is None
    # On this machine: a child holding 200 MB counts under this process, not beside it.
    page = os.sysconf("SC_PAGE_SIZE")
    alone = sysmetrics.tree_rss(util.process_table(), os.getpid(), page)
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; b = bytearray(200 << 20);"
                              " b[::4096] = b'x' * len(b[::4096]); print(1, flush=True); "
                              "time.sleep(30)"], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline()
        held = sysmetrics.tree_rss(util.process_table(), os.getpid(), page)
    finally:
        child.kill()
        child.wait()
    assert held is not None and alone is not None and held - alone > 190 << 20


def test_the_cluster_interface_is_the_one_routing_the_nodes_address() -> None:
    assert sysmetrics.interface_for("10.89.0.5", ROUTE) == "podman1"
    assert sysmetrics.interface_for("192.0.2.7", ROUTE) == "eth0"     # its subnet
    assert sysmetrics.interface_for("198.51.100.1", ROUTE) == "eth0"  # the default route
    assert sysmetrics.interface_for("127.0.0.1", ROUTE) == "lo"
    assert sysmetrics.interface_for("10.89.0.5", ROUTE.splitlines()[0]) is None
    assert sysmetrics.parse_net_dev(NET_DEV, "eth0") == (21411698763, 27348010)
    with pytest.raises(KeyError):
        sysmetrics.parse_net_dev(NET_DEV, "ib0")
    received, sent = sysmetrics.parse_net_dev(Path("/proc/net/dev").read_text(), "lo")
    assert received > 0 and sent > 0


def test_nvidia_smis_csv_and_a_gpu_it_cannot_read() -> None:
    gpus = sysmetrics.parse_smi("0, 97, 40960, 81559\n1, [N/A], [N/A], 81559\n\n")
    assert gpus == [sysmetrics.Gpu(0, 97.0, 40960 << 20, 81559 << 20)]


def test_a_sample_of_this_machine_without_and_with_gpus(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")   # no nvidia-smi here: no GPU fields
    sampler = sysmetrics.Sampler(os.getpid(), "127.0.0.1")
    time.sleep(0.3)
    sample = sampler.sample()
    assert sample is not None   # (None: the job has ended)
    assert 0 <= sample["cpu_pct"] <= 100
    assert 0 < sample["mem_available"] < sample["mem_total"]
    assert sample["job_rss"] > 10 << 20        # this Python at least
    assert sample["net"]["iface"] == "lo" and sample["net"]["rx_bps"] >= 0
    assert "gpus" not in sample
    assert abs(sample["t"] - time.time()) < 5
    monkeypatch.setenv("PATH", f"{SMI_BIN}:/usr/bin:/bin")
    sample = sysmetrics.Sampler(os.getpid(), "127.0.0.1").sample()
    assert sample is not None
    assert sample["gpus"] == [{"index": 0, "util_pct": 0.0, "mem_used": 1024 << 20,
                               "mem_total": 81559 << 20},
                              {"index": 1, "util_pct": 0.0, "mem_used": 512 << 20,
                               "mem_total": 81559 << 20}]
    line = sysmetrics.system_line(sample)
    assert line.startswith(f"{SYSTEM_MARKER} {{") and "\n" not in line
    # Given one GPU of the node (Slurm's CUDA_VISIBLE_DEVICES), the run samples that one:
    # the other is another user's.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert sysmetrics.visible_gpus() == {1}
    sample = sysmetrics.Sampler(os.getpid(), "127.0.0.1").sample()
    assert sample is not None
    assert [g["index"] for g in sample["gpus"]] == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f6c")   # by UUID: every GPU
    assert sysmetrics.visible_gpus() is None
    for none in ("", "-1"):
        assert sysmetrics.visible_gpus({"CUDA_VISIBLE_DEVICES": none}) == set()
    assert sysmetrics.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,-1,3"}) == {2}   # as CUDA
    assert sysmetrics.visible_gpus({}) is None


def test_sampling_ends_with_the_job_no_sample_after_it(tmp_path: Path) -> None:
    """A sample taken once the job's root has exited (a zombie not yet reaped, or gone)
    would say the job holds 0 bytes: none is taken, and the sampling ends."""
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    sampler = sysmetrics.Sampler(job.pid, "127.0.0.1")
    lines: list[str] = []
    out = SimpleNamespace(append=lines.append)
    stop = threading.Event()
    sampling = threading.Thread(target=sysmetrics.keep_sampling,
                                args=(sampler, out, stop, 0.05), daemon=True)
    try:
        sampling.start()
        deadline = time.monotonic() + 10
        while not lines and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lines and json.loads(lines[0].split(" ", 1)[1])["job_rss"] > 1 << 20
        job.kill()
        time.sleep(0.3)   # a zombie: killed, not yet reaped
        assert sampler.sample() is None
        sampling.join(timeout=5)
        assert not sampling.is_alive()   # ended by itself, STOP never set
    finally:
        stop.set()
        job.kill()
        job.wait()
    assert all(json.loads(line.split(" ", 1)[1])["job_rss"] > 1 << 20 for line in lines)
    assert sampler.sample() is None   # reaped: gone


def test_the_supervisors_lines_are_not_the_jobs_progress(tmp_path: Path) -> None:
    """A job that prints nothing stays quiet for the hang watch though its supervisor
    writes a sample into its output; a line of its own is progress again."""
    log = tmp_path / "output.log"
    log.write_text("[rank0]:started\n")
    os.utime(log, (time.time() - 100, time.time() - 100))
    own = sysmetrics.OutputLines(str(log))
    own.append(sysmetrics.system_line({"t": 1.0}))
    own.append(sysmetrics.system_line({"t": 2.0}))
    assert _quiet_for(str(tmp_path), own) > 99
    assert _quiet_for(str(tmp_path)) < 5             # by the log's time alone: progress
    with open(log, "a") as fh:
        fh.write("[rank0]:step 1\n")
    assert _quiet_for(str(tmp_path), own) < 5
    own.append(sysmetrics.system_line({"t": 3.0}))
    assert _quiet_for(str(tmp_path), own) < 5
    assert log.read_text().splitlines() == [
        "[rank0]:started", f'{SYSTEM_MARKER} {{"t":1.0}}', f'{SYSTEM_MARKER} {{"t":2.0}}',
        "[rank0]:step 1", f'{SYSTEM_MARKER} {{"t":3.0}}']


def test_the_runs_gpus_idle_seconds() -> None:
    """`usage`'s idle GPU-hours: between two samples, each GPU at or under 1 % counts the
    time between them; a sample without GPUs or out of order counts nothing."""
    def at(t: float, *utils: float) -> dict:
        return {"t": t, "gpus": [{"index": i, "util_pct": u, "mem_used": 0, "mem_total": 1}
                                 for i, u in enumerate(utils)]}

    idle = sysmetrics.IdleGpus()
    for sample in (at(100, 0, 0), at(110, 0, 0), at(120, 0, 99), at(130, 50, 1.0),
                   {"t": 140}, at(135, 0, 0)):
        idle.add(sample)
    assert idle.seconds == 20 + 10 + 10   # both at 110; GPU 0 at 120; GPU 1 at 130
