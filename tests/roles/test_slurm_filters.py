"""The slurm role's node logic (plugins/filter/slurm_filters.py): what slurm.conf and
gres.conf say of each node from its facts, which nodes sinfo does not show ready, and the
sacctmgr commands that bring accounting to what the inventory says. Pure unit tests."""

from __future__ import annotations

import pytest

from .sources import load

filters = load("plugins/filter/slurm_filters.py", "slurm_filters")


def facts(vcpus=2, mem=4000, gpus=2, fake=True, hostname=None, **extra):
    local = {} if gpus is None else {"clustertrain_gpus": {
        "count": gpus, "fake": fake,
        "files": [f"/dev/clustertrain-fakegpu{i}" for i in range(gpus)]}}
    f = {"processor_vcpus": vcpus, "memtotal_mb": mem, "ansible_local": local}
    if hostname:
        f["hostname"] = hostname
    return {"ansible_facts": f, **extra}


def test_nodes_named_by_inventory_name_with_host_name_address_and_gpus():
    hostvars = {"node0": facts(hostname="gpu-a", cluster_address="10.0.0.5"),
                "node1": facts(vcpus=64, mem=512000, gpus=0, ansible_host="gpu-b.lab")}
    nodes = filters.slurm_nodes(["node0", "node1"], hostvars)
    assert [(n["name"], n["hostname"], n["address"], n["cpus"], n["gpus"]) for n in nodes] == [
        ("node0", "gpu-a", "10.0.0.5", 2, 2), ("node1", "node1", "gpu-b.lab", 64, 0)]
    # slurmd refuses a node with less memory than slurm.conf says: a margin below the fact
    assert nodes[0]["memory_mb"] < 4000
    lines = filters.slurm_conf_nodes(nodes)
    assert lines[0] == ("NodeName=node0 NodeHostname=gpu-a NodeAddr=10.0.0.5 CPUs=2 "
                        f"RealMemory={nodes[0]['memory_mb']} Gres=gpu:2 State=UNKNOWN")
    assert "Gres=" not in lines[1]
    assert filters.slurm_gres_lines(nodes) == [
        "NodeName=node0 Name=gpu File=/dev/clustertrain-fakegpu0,/dev/clustertrain-fakegpu1"]


def test_a_node_without_facts_is_named_with_the_fix():
    with pytest.raises(filters.AnsibleFilterError) as err:
        filters.slurm_nodes(["node0", "node1", "node2"],
                            {"node0": facts(), "node1": facts(gpus=None)})
    text = str(err.value)
    assert "node1, node2" in text and "node0" not in text.split(":")[0]
    assert "run site.yml on the whole cluster" in text


@pytest.mark.parametrize(("lines", "names", "expected"), [
    (["node0 idle", "node1 mix", "node2 alloc"], ["node0", "node1", "node2"], []),
    (["node0 idle", "node1 drain"], ["node0", "node1"], []),
    (["node0 idle*", "node1 unk", "node2 down"], ["node0", "node1", "node2"],
     ["node0 (idle*)", "node1 (unk)", "node2 (down)"]),
    (["node0 idle"], ["node0", "node3"], ["node3 (absent)"]),
    (["node0 drain*"], ["node0"], ["node0 (drain*)"]),
])
def test_not_ready(lines, names, expected):
    assert filters.slurm_not_ready(lines, names) == expected


def shown(cluster=(), account=(), association=(), qos=()):
    def result(item, rows):
        return {"item": item, "stdout_lines": list(rows)}
    return [result("cluster", cluster), result("account", account),
            result("association", association), result("qos", qos)]


def test_accounting_from_nothing():
    changes = filters.slurm_accounting_changes(shown(), "lab", "ct", ["alice", "bob"],
                                               "lab-gpus", 4)
    assert [c["argv"][2:5] for c in changes] == [
        ["add", "cluster", "lab"], ["add", "account", "ct"], ["add", "user", "alice,bob"],
        ["add", "qos", "lab-gpus"], ["modify", "qos", "where"], ["modify", "qos", "where"]]
    assert changes[-2]["argv"][-2:] == ["set", "Flags+=DenyOnLimit"]
    assert changes[-1]["argv"][-1] == "MaxTRESPerUser=gres/gpu=4"
    assert changes[2]["argv"][-2:] == ["Account=ct", "Cluster=lab"]


def test_accounting_already_there_changes_nothing():
    state = shown(cluster=["lab"], account=["ct", "root"],
                  association=["lab|root|", "lab|root|root", "lab|ct|", "lab|ct|alice",
                               "lab|ct|bob"],
                  qos=["normal||", "lab-gpus|gres/gpu=4|DenyOnLimit"])
    assert filters.slurm_accounting_changes(state, "lab", "ct", ["alice", "bob"],
                                            "lab-gpus", 4) == []


def test_accounting_adds_a_new_user_and_lifts_the_limit():
    state = shown(cluster=["lab"], account=["ct"], association=["lab|ct|alice"],
                  qos=["lab-gpus|gres/gpu=4|DenyOnLimit"])
    changes = filters.slurm_accounting_changes(state, "lab", "ct", ["alice", "carol"],
                                               "lab-gpus", 0)
    assert [c["label"] for c in changes] == ["users carol", "qos lab-gpus MaxTRESPerUser=none"]
    assert changes[1]["argv"][-1] == "MaxTRESPerUser=gres/gpu=-1"
    # a user of another account is not in ours
    other = shown(cluster=["lab"], account=["ct"], association=["lab|other|carol"],
                  qos=["lab-gpus||DenyOnLimit"])
    assert [c["label"] for c in filters.slurm_accounting_changes(
        other, "lab", "ct", ["carol"], "lab-gpus", 0)] == ["users carol"]


def test_the_limit_waits_for_the_second_pass():
    """Before slurmctld has registered the GPU TRES, sacctmgr refuses a gres/gpu limit:
    the first pass makes the QOS without it, the second sets it."""
    first = filters.slurm_accounting_changes(shown(), "lab", "ct", [], "lab-gpus", 4, False)
    assert [c["label"] for c in first] == ["cluster lab", "account ct", "qos lab-gpus",
                                           "qos lab-gpus Flags+=DenyOnLimit"]
    second = filters.slurm_accounting_changes(
        shown(cluster=["lab"], account=["ct"], qos=["lab-gpus||DenyOnLimit"]), "lab", "ct", [],
        "lab-gpus", 4)
    assert [c["label"] for c in second] == ["qos lab-gpus MaxTRESPerUser=gres/gpu=4"]


def test_a_qos_without_deny_on_limit_gets_it_and_keeps_its_other_flags():
    """A job above the QOS's limits alone (more GPUs than one user may hold) would wait for
    ever: DenyOnLimit makes Slurm refuse it when it is submitted. Added with '+=' (a
    site's own flags stay), once: a QOS that has it among others is left alone."""
    before = shown(cluster=["lab"], account=["ct"], qos=["lab-gpus|gres/gpu=4|"])
    (change,) = filters.slurm_accounting_changes(before, "lab", "ct", [], "lab-gpus", 4)
    assert change["argv"] == ["sacctmgr", "-i", "modify", "qos", "where", "name=lab-gpus",
                              "set", "Flags+=DenyOnLimit"]
    after = shown(cluster=["lab"], account=["ct"],
                  qos=["lab-gpus|gres/gpu=4|DenyOnLimit,OverPartQOS"])
    assert filters.slurm_accounting_changes(after, "lab", "ct", [], "lab-gpus", 4) == []
