"""The node package on real nodes, over real SSH through the bastion: a node that lacks
this version gets it once, as the job's user; the next launch of the same version copies
nothing (test_nodelib.py shows the same rule with bash standing in for SSH)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cluster import nodelib

from ...cluster import ProvisionedCluster as Sandbox
from ..run.test_train_sandbox import Train

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1500)]
NODES = ("node0", "node1")


def lib(sandbox: Sandbox) -> str:
    return f"/home/{sandbox.user}/.clustertrain/lib"


def installed(sandbox: Sandbox, node: str) -> str:
    """Every file of the node's copies, with its owner and inode: a new copy changes both
    the inode and, for a file Python rewrote, the line."""
    return sandbox.exec(node, "sh", "-c", f"cd {lib(sandbox)} && find . -type f -name '*.py' "
                        "-printf '%p %u %i\\n' | sort").stdout


def test_a_second_launch_of_the_same_version_copies_nothing(sandbox_cluster: Sandbox,
                                                            tmp_path: Path) -> None:
    for node in NODES:   # as on a node that never ran this version
        sandbox_cluster.exec(node, "rm", "-rf", lib(sandbox_cluster))
    first = Train(sandbox_cluster, tmp_path / "1", "--nodes", "2", "ddp_allreduce.py", "--",
                  "--steps", "1")
    assert first.finish() == 0, first.text[-3000:] + first.stderr
    version = nodelib.bundle().version
    before = {node: installed(sandbox_cluster, node) for node in NODES}
    for node, files in before.items():
        assert f"./{version}/node.py {sandbox_cluster.user} " in files, (node, files)
        assert f"./{version}/orchestrator/node/supervise.py" in files, (node, files)
        assert {line.split("/")[1] for line in files.splitlines()} == {version}, files
    second = Train(sandbox_cluster, tmp_path / "2", "--nodes", "2", "ddp_allreduce.py", "--",
                   "--steps", "1")
    assert second.finish() == 0, second.text[-3000:] + second.stderr
    assert {node: installed(sandbox_cluster, node) for node in NODES} == before
