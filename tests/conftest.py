"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import defaultdict

import pytest

from orchestrator.resources import project

os.environ.setdefault("CONTAINERS_CONF", str(project().containers_conf))
# On a machine shared with others' sandboxes: the names of those the tests make begin with it.
NAME_PREFIX = os.environ.get("CLUSTERTRAIN_TEST_SANDBOX_PREFIX", "")


class Lanes:
    """When each of pytest-xdist's workers (make test's lanes) ended its last test, and what
    it spent on its 15 longest test files: printed at the end, to balance the lanes by."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.busy: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.end: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        lane = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
        if lane is None:
            return
        self.busy[lane][report.nodeid.split("::")[0]] += report.duration
        self.end[lane] = time.monotonic() - self.start

    def lines(self) -> list[str]:
        out = []
        for lane in sorted(self.busy):
            files = sorted(self.busy[lane].items(), key=lambda kv: -kv[1])
            out.append(f"lane {lane}: ended at {self.end[lane]:.0f} s, busy "
                       f"{sum(self.busy[lane].values()):.0f} s in {len(files)} files")
            out += [f"  {seconds:7.1f} s  {name}" for name, seconds in files[:15]]
        return out

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if len(self.busy) > 1:
            terminalreporter.write_sep("=", "the lanes")
            for line in self.lines():
                terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    # Many tests press Ctrl-C on the commands they start, as a user at a terminal does.
    # A shell script that puts `make test` in the background (`make test &`, or a CI
    # runner's script) starts it with SIGINT ignored, every process inherits that through
    # exec, and Python then keeps ignoring it: those commands never saw the Ctrl-C and the
    # tests timed out. A handler here (each xdist worker runs this too) is reset to the
    # default at exec, so every command a test starts can be interrupted.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(Lanes(), "clustertrain-lanes")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each failing test, a line in CLUSTERTRAIN_TEST_FAILURES (make test prints them last:
    CI shows the end of its output, and molecule's logs come after the sandbox tests')."""
    path = os.environ.get("CLUSTERTRAIN_TEST_FAILURES")
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return   # (pytest-xdist's workers pass their reports on to the controller)
    crash = getattr(report.longrepr, "reprcrash", None)
    why = (crash.message if crash else str(report.longrepr)).strip().splitlines() or [""]
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"FAILED {report.nodeid} ({report.when}): {why[0][:400]}\n")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that hold a long test (marker `long`) first: make test's two lanes take a
    file at a time in this order (pytest-xdist, --dist loadfile --no-loadscope-reorder)."""
    first = {item.path for item in items if item.get_closest_marker("long")}
    items.sort(key=lambda item: item.path not in first)


@pytest.fixture
def sandbox_name():
    """A sandbox name unique to this test run; whatever it left behind is removed after the test."""
    from orchestrator.sandbox import cluster

    names: list[str] = []

    def make(prefix: str = "t") -> str:
        name = f"{NAME_PREFIX}{prefix}-{uuid.uuid4().hex[:8]}"
        names.append(name)
        return name

    yield make
    for name in names:
        cluster.down(name, log=lambda *_: None)


@pytest.fixture(scope="session")
def sandbox_cluster():
    """The shared cluster (tests/shared_cluster.py), shared by the orchestrator's sandbox
    tests and the e2e tests: provisioning takes minutes on two cores and every such test
    needs exactly this. The nodes are reached only through a bastion (ProxyJump), by name,
    as the non-root user alice; site.yml runs as alice with become. One outsider on the same
    network, not a member, shows what the cluster keeps out (tests/roles/test_site_sandbox.py).
    The cluster runs Slurm (two fake GPUs per node, a test double), as a shared site does;
    runs that do not ask for its queue start over SSH as on any cluster.
    CLUSTERTRAIN_TEST_SANDBOX names one made beforehand (make test makes it beside the unit
    tests), which the session leaves as it found it; without it, the session makes its own.
    Several names, comma-separated, are lanes: pytest-xdist's worker N takes the Nth (make
    test runs two lanes, each on its own cluster, so that no test shares its nodes)."""
    import json
    import secrets
    import sys
    from pathlib import Path

    from . import shared_cluster
    from .cluster import ProvisionedCluster, orchestrator

    def cluster_of(info: dict) -> ProvisionedCluster:
        nodes = [n for n in info["nodes"] if not n["outsider"]]
        return ProvisionedCluster(info["name"], Path(info["inventory"]), Path(info["share"]),
                                  {n["name"]: n["address"] for n in nodes},
                                  {n["name"]: n["container"] for n in info["nodes"]},
                                  {u: Path(v["inventory"]) for u, v in info["users"].items()})

    lanes = [n for n in os.environ.get("CLUSTERTRAIN_TEST_SANDBOX", "").split(",") if n]
    if lanes:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
        reuse = lanes[int(worker.removeprefix("gw")) % len(lanes)]
        st = orchestrator("sandbox", "status", "--name", reuse, "--json")
        assert st.returncode == 0, st.stderr
        yield cluster_of(json.loads(st.stdout))
        return
    name = f"{NAME_PREFIX}cl-{secrets.token_hex(3)}"
    try:
        [info] = shared_cluster.up([name],
                                   say=lambda line: print("\n" + line, file=sys.stderr))
    except shared_cluster.ProvisionFailed as exc:
        pytest.fail(f"the shared cluster {name} could not be made: {exc}")
    try:
        yield cluster_of(info)
    finally:
        shared_cluster.down(name)
