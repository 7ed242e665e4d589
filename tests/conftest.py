"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import uuid

import pytest

from orchestrator.resources import project

os.environ.setdefault("CONTAINERS_CONF", str(project().containers_conf))
# On a machine shared with others' sandboxes: the names of those the tests make begin with it.
NAME_PREFIX = os.environ.get("CLUSTERTRAIN_TEST_SANDBOX_PREFIX", "")


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


def _say_ready(name: str) -> None:
    """Write CLUSTERTRAIN_TEST_READY_FILE once the shared cluster is provisioned: make test
    starts molecule's scenarios then, beside the tests (not beside the provisioning)."""
    from pathlib import Path
    ready = os.environ.get("CLUSTERTRAIN_TEST_READY_FILE")
    if ready:
        Path(ready).write_text(name + "\n")


@pytest.fixture(scope="session")
def sandbox_cluster():
    """One 3-node sandbox that plays a real site, provisioned by the real site.yml
    (wheelhouse and the generated dataset on its share), shared by the orchestrator's
    sandbox tests and the e2e tests: provisioning takes minutes on two cores and every
    such test needs exactly this. The nodes are reached only through a bastion
    (ProxyJump), by name, as the non-root user alice; site.yml runs as alice with become.
    One outsider on the same network, not a member, shows what the cluster keeps out
    (tests/roles/test_site_sandbox.py). The cluster runs Slurm (sandbox up --slurm: two
    fake GPUs per node, a test double), as a shared site does; runs that do not ask for
    its queue start over SSH as on any cluster."""
    import json
    import secrets
    import sys
    import time
    from pathlib import Path

    from .cluster import BIN, ProvisionedCluster, orchestrator, run

    def cluster_of(info: dict) -> ProvisionedCluster:
        nodes = [n for n in info["nodes"] if not n["outsider"]]
        return ProvisionedCluster(info["name"], Path(info["inventory"]), Path(info["share"]),
                                  {n["name"]: n["address"] for n in nodes},
                                  {n["name"]: n["container"] for n in nodes},
                                  {u: Path(v["inventory"]) for u, v in info["users"].items()})

    reuse = os.environ.get("CLUSTERTRAIN_TEST_SANDBOX")
    if reuse:  # daily work: a sandbox made and provisioned the same way, kept between runs
        st = orchestrator("sandbox", "status", "--name", reuse, "--json")
        assert st.returncode == 0, st.stderr
        _say_ready(reuse)
        yield cluster_of(json.loads(st.stdout))
        return
    name = f"{NAME_PREFIX}cl-{secrets.token_hex(3)}"
    up = orchestrator("sandbox", "up", "--nodes", "3", "--outsiders", "1", "--bastion",
                      "--slurm", "--name", name, "--json")
    assert up.returncode == 0, up.stderr
    try:
        info = json.loads(up.stdout)
        share = Path(info["share"])
        wheelhouse = Path(__file__).resolve().parents[1] / ".cache" / "wheelhouse"
        wh = orchestrator("wheelhouse", "--env", "environment.yml", "--dest", str(wheelhouse))
        assert wh.returncode == 0, wh.stdout + wh.stderr
        run("cp", "-al", str(wheelhouse), str(share / "wheelhouse"), check=True)
        data = orchestrator("data", "synthetic", "--dest", str(share / "data" / "cifar10"))
        assert data.returncode == 0, data.stderr
        started = time.monotonic()
        site = run(str(BIN / "ansible-playbook"), "-i", info["inventory"], "site.yml")
        assert site.returncode == 0, site.stdout[-6000:] + site.stderr[-2000:]
        print(f"\n{name}: site.yml took {time.monotonic() - started:.0f} s", file=sys.stderr)
        _say_ready(name)
        yield cluster_of(info)
    finally:
        orchestrator("sandbox", "down", "--name", name)
