"""Which packages differ between nodes, and how preflight judges the facts."""

from orchestrator.inventory import Cluster, NodeSpec
from orchestrator.preflight import Report, _judge, fingerprint_drift, render_table
from orchestrator.probe import NodeFacts
from orchestrator.ssh import SshTarget


def spec(name: str, address: str | None = None) -> NodeSpec:
    address = address or f"192.0.2.{10 + int(name[-1])}"
    return NodeSpec(name=name, ssh=SshTarget(host=address, user="alice"),
                    cluster_address=address)


def facts(name: str, packages: dict, **kw) -> NodeFacts:
    node = spec(name)
    defaults = dict(
        fingerprint={"python": "3.11.2", "packages": packages, "torch": "2.13.0+cpu",
                     "cuda": None, "sha256": str(sorted(packages.items()))},
        python_env={"python": "/v/bin/python", "torchrun": "/v/bin/torchrun"},
        torch={"ok": True, "version": "2.13.0+cpu", "gpus": 0, "torchrun": True},
        shared={"ok": True}, resolve=None, clock_offset=0.0, port_free=True, free_port=29500,
        user="alice", uid=1001, home="/home/alice")
    defaults.update(kw)
    return NodeFacts(node, **defaults)


def report(*f: NodeFacts, port: int = 29500) -> Report:
    nodes = tuple(x.node for x in f)
    for x in f:  # by default every node resolves every address (IPs resolve to themselves)
        if x.resolve is None:
            x.resolve = {n.cluster_address: n.cluster_address for n in nodes}
    r = Report(Cluster(inventory=None, nodes=nodes), list(f))
    _judge(r, port, strict_port=False)
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
               NodeFacts(spec("node2"),
                         error="node2: cannot reach alice@192.0.2.12 (timed out)"))
    text = "\n".join(r.problems)
    assert "node1: torch is not importable" in text and "No module named 'torch'" in text
    assert "node1: shared path not readable" in text
    assert "node2: cannot reach" in text
    assert any("clocks differ by 5.0 s" in w for w in r.warnings)


def test_table_shows_the_nproc_the_job_will_get() -> None:
    f = [facts("node0", {"torch": "2.13.0"}), facts("node1", {"torch": "2.13.0"})]
    auto = report(*f)
    assert [row.split()[6] for row in render_table(auto).splitlines()[1:]] == ["1", "1"]
    given = Report(Cluster(inventory=None, nodes=tuple(x.node for x in f)), f, nproc_per_node=4)
    _judge(given, 29500, strict_port=False)
    assert given.nproc(f[0]) == 4
    assert [row.split()[6] for row in render_table(given).splitlines()[1:]] == ["4", "4"]


def test_master_address_is_node0s_name_resolved_on_the_nodes() -> None:
    a, b = facts("node0", {}), facts("node1", {})
    for f, name in ((a, "node0.lab"), (b, "node1.lab")):
        object.__setattr__(f, "node", NodeSpec(f.node.name, f.node.ssh, name))
    a.resolve = {"node0.lab": "10.1.0.10", "node1.lab": "10.1.0.11"}
    b.resolve = dict(a.resolve)
    r = report(a, b)
    assert r.problems == [] and r.master_addr == "10.1.0.10"
    assert "node0.lab[10.1.0.10]" in render_table(r)


def test_unresolvable_master_name_is_refused_naming_the_nodes() -> None:
    a, b = facts("node0", {}), facts("node1", {})
    object.__setattr__(a, "node", NodeSpec("node0", a.node.ssh, "node0.lab"))
    a.resolve = {"node0.lab": "10.1.0.10", "192.0.2.11": "192.0.2.11"}
    b.resolve = {"node0.lab": None, "192.0.2.11": "192.0.2.11"}
    r = report(a, b)
    assert r.master_addr is None
    assert any(p.startswith("node1 cannot resolve node0's cluster_address 'node0.lab', the "
                            "master address") for p in r.problems)


def test_two_names_for_one_machine_are_refused() -> None:
    a, b = facts("node0", {}), facts("node1", {})
    object.__setattr__(b, "node", NodeSpec("node1", b.node.ssh, "alias.lab"))
    a.resolve = {"192.0.2.10": "192.0.2.10", "alias.lab": "192.0.2.10"}
    b.resolve = dict(a.resolve)
    r = report(a, b)
    assert any("node0 and node1 both resolve to 192.0.2.10" in p for p in r.problems)


def test_privileged_master_port_is_refused_for_a_non_root_user() -> None:
    r = report(facts("node0", {}), facts("node1", {}), port=80)
    assert any("node0: master port 80 is privileged (below 1024) and the job runs as alice"
               in p for p in r.problems)
    root = facts("node0", {}, user="root", uid=0)
    assert report(root, facts("node1", {}), port=80).problems == []
