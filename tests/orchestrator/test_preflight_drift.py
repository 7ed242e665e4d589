"""Which packages differ between nodes, and how preflight judges the facts."""

from orchestrator.inventory import Cluster, NodeSpec
from orchestrator.preflight import Report, _judge, fingerprint_drift, render_table
from orchestrator.probe import NodeFacts


def facts(name: str, packages: dict, **kw) -> NodeFacts:
    node = NodeSpec(name=name, host=f"192.0.2.{len(name)}", cluster_address="192.0.2.1")
    defaults = dict(
        fingerprint={"python": "3.11.2", "packages": packages, "torch": "2.13.0+cpu",
                     "cuda": None, "sha256": str(sorted(packages.items()))},
        python_env={"python": "/v/bin/python", "torchrun": "/v/bin/torchrun"},
        torch={"ok": True, "version": "2.13.0+cpu", "gpus": 0, "torchrun": True},
        shared={"ok": True}, resolve={}, clock_offset=0.0, port_free=True, free_port=29500)
    defaults.update(kw)
    return NodeFacts(node, **defaults)


def report(*f: NodeFacts) -> Report:
    r = Report(Cluster(inventory=None, nodes=tuple(x.node for x in f)), list(f))
    _judge(r, 29500, strict_port=False)
    return r


def test_identical_fingerprints_no_drift() -> None:
    r = report(facts("node0", {"torch": "2.13.0"}), facts("node1", {"torch": "2.13.0"}))
    assert fingerprint_drift(r.facts) == []
    assert r.problems == [] and r.master_port == 29500 and r.backend == "gloo"
    assert r.nproc(r.facts[0]) == 1


def test_drift_names_package_and_nodes() -> None:
    r = report(facts("node0", {"torch": "2.13.0", "numpy": "2.1.0"}),
               facts("node1", {"torch": "2.13.0", "numpy": "2.2.0"}),
               facts("node2", {"torch": "2.13.0"}))
    assert fingerprint_drift(r.facts) == [
        "package numpy: node0=2.1.0, node1=2.2.0, node2=absent"]
    assert any("environment drift" in p and "numpy" in p for p in r.problems)
    assert "DRIFT" in render_table(r)


def test_port_taken_moves_and_gpu_nodes_use_nccl() -> None:
    r = report(facts("node0", {}, port_free=False, free_port=29501,
                     torch={"ok": True, "version": "2", "gpus": 8, "torchrun": True}),
               facts("node1", {}, torch={"ok": True, "version": "2", "gpus": 8,
                                         "torchrun": True}))
    assert r.master_port == 29501
    assert "master port 29500 is in use; using 29501 instead" in r.warnings[0]
    assert r.backend == "nccl" and r.nproc(r.facts[1]) == 8


def test_blocking_problems_name_node_and_fix() -> None:
    r = report(facts("node0", {}),
               facts("node1", {}, torch={"ok": False, "error": "No module named 'torch'"},
                     shared={"ok": False, "error": "/mnt/cluster: No such file or directory"},
                     clock_offset=5.0),
               NodeFacts(NodeSpec("node2", "192.0.2.9", "192.0.2.9"),
                         error="node2: cannot reach root@192.0.2.9:22 (timed out)"))
    text = "\n".join(r.problems)
    assert "node1: torch is not importable" in text and "No module named 'torch'" in text
    assert "node1: shared path not readable" in text
    assert "node2: cannot reach" in text
    assert any("clocks differ by 5.0 s" in w for w in r.warnings)


def test_table_shows_the_nproc_the_job_will_get() -> None:
    f = [facts("node0", {"torch": "2.13.0"}), facts("node1", {"torch": "2.13.0"})]
    auto = report(*f)
    assert [row.split()[5] for row in render_table(auto).splitlines()[1:]] == ["1", "1"]
    given = Report(Cluster(inventory=None, nodes=tuple(x.node for x in f)), f, nproc_per_node=4)
    _judge(given, 29500, strict_port=False)
    assert given.nproc(f[0]) == 4
    assert [row.split()[5] for row in render_table(given).splitlines()[1:]] == ["4", "4"]
