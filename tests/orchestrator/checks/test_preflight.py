"""Which packages differ between nodes, and how preflight judges the facts."""

import time
from pathlib import Path
from typing import Any

from orchestrator.checks.preflight import (
    Report,
    _judge,
    _judge_reach,
    fingerprint_drift,
    render_table,
)
from orchestrator.checks.probe import NodeFacts
from orchestrator.cluster.inventory import Cluster, NodeSpec
from orchestrator.cluster.ssh import SshTarget
from orchestrator.node.answers import Busy, GpuProcess, LiveRun, ReachAnswer
from orchestrator.node.busy import parse_apps, parse_gpus


def spec(name: str, address: str | None = None) -> NodeSpec:
    address = address or f"192.0.2.{10 + int(name[-1])}"
    return NodeSpec(name=name, ssh=SshTarget(host=address, user="alice"),
                    cluster_address=address)


def facts(name: str, packages: dict, **kw) -> NodeFacts:
    node = spec(name)
    defaults: dict[str, Any] = dict(
        fingerprint={"python": "3.11.2", "packages": packages, "torch": "2.13.0+cpu",
                     "cuda": None, "sha256": str(sorted(packages.items()))},
        python_env={"python": "/v/bin/python", "torchrun": "/v/bin/torchrun"},
        torch={"ok": True, "version": "2.13.0+cpu", "gpus": 0, "torchrun": True},
        shared={"ok": True}, resolve=None, clock_offset=0.0, port_free=True, free_port=29500,
        user="alice", uid=1001, home="/home/alice")
    defaults.update(kw)
    return NodeFacts(node, **defaults)


def reached(data: dict) -> ReachAnswer:
    """A node's round 2, as its `reach` answers it."""
    return ReachAnswer.from_json(data)


def report(*f: NodeFacts, port: int = 29500) -> Report:
    nodes = tuple(x.node for x in f)
    for x in f:  # by default every node resolves every address (IPs resolve to themselves)
        if x.resolve is None:
            x.resolve = {n.cluster_address: n.cluster_address for n in nodes}
    r = Report(Cluster(inventory=Path("/site/hosts.yml"), nodes=nodes), list(f))
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


def test_a_node_changed_since_provisioning_is_named_with_the_command_that_realigns_it():
    provisioned = {"python": "3.11.2", "packages": {"torch": "2.13.0", "fsspec": "2026.9.0"},
                   "torch": "2.13.0+cpu", "cuda": None, "sha256": "p"}
    live = dict(provisioned, packages={"torch": "2.13.0"}, sha256="l")
    r = report(facts("node0", {}, fingerprint=provisioned, provisioned=provisioned),
               facts("node1", {}, fingerprint=live, provisioned=provisioned))
    [problem] = r.problems
    assert problem.splitlines() == [
        "environment drift (read from each node's environment now):",
        "    package fsspec: node0=2026.9.0, node1=absent",
        "    node1 since provisioning: package fsspec: 2026.9.0 when provisioned, absent now",
        "  re-align node1: ansible-playbook site.yml -i /site/hosts.yml --limit node1"]
    rows = render_table(r).splitlines()
    assert "DRIFT" in rows[2] and "DRIFT" not in rows[1]


def test_all_nodes_changed_alike_is_drift_from_what_was_provisioned() -> None:
    provisioned = {"python": "3.11.2", "packages": {"numpy": "2.1.0"}, "sha256": "p"}
    live = dict(provisioned, packages={"numpy": "2.2.0"}, sha256="l")
    r = report(*(facts(n, {}, fingerprint=live, provisioned=provisioned)
                 for n in ("node0", "node1")))
    assert "--limit node0,node1" in r.problems[0]
    assert "node0 since provisioning: package numpy: 2.1.0 when provisioned, 2.2.0 now" \
        in r.problems[0]


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
    assert ("node1: shared path: /mnt/cluster: No such file or directory; check the "
            "nfs_client mount") in text
    assert "node2: cannot reach" in text
    assert any("clocks differ by 5.0 s" in w for w in r.warnings)


def test_table_shows_the_nproc_the_job_will_get() -> None:
    f = [facts("node0", {"torch": "2.13.0"}), facts("node1", {"torch": "2.13.0"})]
    auto = report(*f)
    assert [row.split()[6] for row in render_table(auto).splitlines()[1:]] == ["1", "1"]
    given = Report(Cluster(inventory=Path("/site/hosts.yml"), nodes=tuple(x.node for x in f)),
                   f, nproc_per_node=4)
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


def test_shared_path_causes_are_named_with_the_node_and_a_fix() -> None:
    r = report(facts("node0", {}),
               facts("node1", {}, shared={"ok": False, "kind": "not_mounted",
                                          "error": "/mnt/cluster is not a mount point"}),
               facts("node2", {}, shared={"ok": False, "kind": "not_writable",
                                          "error": "/mnt/cluster/checkpoints/alice is not "
                                          "writable by alice (uid 1001): Permission denied"}))
    text = "\n".join(r.problems)
    assert ("node1: shared path: /mnt/cluster is not a mount point; mount the share there "
            "(the nfs_client role: ansible-playbook site.yml -i /site/hosts.yml --limit "
            "node1)") in text
    assert "node2: shared path: /mnt/cluster/checkpoints/alice is not writable by alice" in text
    assert [row.split()[8] for row in render_table(r).splitlines()[1:]] == ["ok", "FAIL", "FAIL"]


def test_a_squatted_place_on_the_share_is_refused_with_the_nodes_own_fix() -> None:
    """The node names the place, its owner and what to do (node/preflight.py not_own):
    preflight says it as it is, and the port claims that could not be made are a warning."""
    mine = "/mnt/cluster/checkpoints/carol"
    r = report(facts("node0", {}, port_warning="launches cannot claim their master port "
                     "here (two at the same moment could take the same one): /tmp/clustertrain-"
                     "ports is mode 0755, not 1777 (made by bob): ask bob or an admin to "
                     "remove it (sudo rm -rf /tmp/clustertrain-ports)"),
               facts("node1", {}, shared={
                   "ok": False, "kind": "not_own",
                   "error": f"{mine} belongs to bob, not to carol: bob could read and "
                            "replace what carol's runs keep there",
                   "fix": f"ask bob or an admin to remove it (sudo rm -rf {mine}), then run "
                          "again: the tool makes it anew, carol's own, mode 0700"}))
    assert r.problems == [
        f"node1: shared path: {mine} belongs to bob, not to carol: bob could read and replace "
        f"what carol's runs keep there; ask bob or an admin to remove it (sudo rm -rf {mine}),"
        " then run again: the tool makes it anew, carol's own, mode 0700"]
    assert r.master_port == 29500
    assert any(w.startswith("node0: launches cannot claim their master port here")
               for w in r.warnings)


def test_master_port_not_reached_and_another_filesystem_are_named() -> None:
    n0 = facts("node0", {}, listener={"port": 29500, "ok": True, "self": {"ok": True}})
    n1 = facts("node1", {}, reach=reached({"token": {"ok": True},
                                           "connect": {"ok": False, "error": "no answer "
                                                       "within 3 s (packets dropped: a "
                                                       "firewall?)"}}))
    n2 = facts("node2", {}, reach=reached({"token": {"ok": False,
                                                     "error": "No such file or directory"},
                                           "connect": {"ok": True}}))
    r = report(n0, n1, n2)
    _judge_reach(r, 29500)
    text = "\n".join(r.problems)
    assert ("node1 cannot connect to node0's master port 29500 at 192.0.2.10: no answer "
            "within 3 s (packets dropped: a firewall?); open TCP port 29500 on node0") in text
    assert ("node2: /mnt/cluster is not the same filesystem as on node0: a file node0 wrote "
            "to /mnt/cluster/checkpoints/ is not there (No such file or directory)") in text
    assert [row.split()[9] for row in render_table(r).splitlines()[1:]] == [
        "29500", "FAIL", "ok"]


def test_round_two_asks_only_the_nodes_that_could_not_check_ahead(monkeypatch) -> None:
    """node1 connected to node 0's port and read its token at the end of round 1; node2
    could not (None), and node3 checked a port node 0 did not listen on: those two are
    asked again, at node 0's port. (The SSH round itself: a stand-in that records who is
    asked; the real one runs in the sandbox's preflight tests.)"""
    from orchestrator.checks import preflight
    from orchestrator.checks.probe import Rendezvous

    asked: list[tuple[str, int]] = []

    def reach(node, conn, *, addr, port, rendezvous, shared_path):  # noqa: ANN001, ANN202
        asked.append((node.name, port))
        return reached({"token": {"ok": True}, "connect": {"ok": True}})

    monkeypatch.setattr(preflight, "reach", reach)
    ahead = {"addr": "192.0.2.10", "port": 29501, "token": {"ok": True},
             "connect": {"ok": True}}
    r = report(facts("node0", {}, listener={"port": 29501, "ok": True, "self": {"ok": True}}),
               facts("node1", {}, reach=reached(ahead)), facts("node2", {}, reach=None),
               facts("node3", {}, reach=reached({**ahead, "port": 29500})))
    r.clients = {f.node.name: object() for f in r.facts}  # type: ignore[misc]
    preflight._second_round(r, Rendezvous.new(4))
    assert asked == [("node2", 29501), ("node3", 29501)]
    assert r.problems == []


STRANGER = {"addr": "192.0.2.66", "said": "stop 1a2b3c4d 5e6f"}


def test_a_stranger_at_node0s_listener_is_named_never_the_share_or_the_firewall() -> None:
    """Someone connected to node 0's listener and could not prove the run's key (bob, who
    read its greeting): node1 learnt it when it got through, node2 could not connect. The
    verdict names the stranger, not node2's firewall; without a failure it is a warning."""
    n0 = facts("node0", {}, listener={"port": 29500, "ok": True, "self": {"ok": True}})
    n1 = facts("node1", {}, reach=reached({"token": {"ok": True}, "connect": {"ok": True},
                                           "strangers": [STRANGER]}))
    n2 = facts("node2", {}, reach=reached({"token": {"ok": True},
                                           "connect": {"ok": False, "error": "no answer "
                                                       "within 3 s (packets dropped: a "
                                                       "firewall?)"}}))
    r = report(n0, n1, n2)
    _judge_reach(r, 29500)
    assert r.problems == [
        "node2 cannot connect to node0's master port 29500 at 192.0.2.10: someone else "
        "connected to node0's listener on port 29500 (from 192.0.2.66, saying 'stop "
        "1a2b3c4d 5e6f') and could not prove the run's key: another user's process? Run "
        "again; if it recurs, ask an admin who connects to node0:29500 from 192.0.2.66"]
    n2.reach = reached({"token": {"ok": True}, "connect": {"ok": True}})
    r = report(n0, n1, n2)
    _judge_reach(r, 29500)
    assert r.problems == [] and r.warnings == [
        "someone else connected to node0's listener on port 29500 (from 192.0.2.66, saying "
        "'stop 1a2b3c4d 5e6f') and could not prove the run's key: another user's process? "
        "It was not counted: the run's own nodes all got through"]


def test_a_stranger_node0s_listener_names_when_stopped_is_in_the_verdict(monkeypatch) -> None:
    """No other node got through to tell: node 0's listener, stopped with the run's key,
    names who connected without it."""
    from orchestrator.checks import preflight
    from orchestrator.checks.probe import Rendezvous

    def reach(node, conn, *, addr, port, rendezvous, shared_path):  # noqa: ANN001, ANN202
        return reached({"token": {"ok": True}, "connect": {"ok": False, "error": "timed out"}})

    def stop_listener(node, conn, port, rendezvous):  # noqa: ANN001, ANN202
        return [STRANGER]

    monkeypatch.setattr(preflight, "reach", reach)
    monkeypatch.setattr(preflight, "stop_listener", stop_listener)
    r = report(facts("node0", {}, listener={"port": 29500, "ok": True, "self": {"ok": True}}),
               facts("node1", {}, reach=None))
    r.clients = {f.node.name: object() for f in r.facts}  # type: ignore[misc]
    preflight._second_round(r, Rendezvous.new(2))
    [problem] = r.problems
    assert problem.startswith("node1 cannot connect to node0's master port 29500 at "
                              "192.0.2.10: someone else connected to node0's listener on "
                              "port 29500 (from 192.0.2.66"), problem
    assert "firewall" not in problem


def test_the_runs_key_never_shows_in_the_rendezvous_repr() -> None:
    from orchestrator.checks.probe import Rendezvous
    r = Rendezvous.new(2)
    assert len(r.key) == 64 and r.key not in repr(r) and r.key != r.token_value


def test_gpus_counted_without_torch_against_what_torch_sees() -> None:
    gpu = {"ok": True, "version": "2.13.0+cu128", "gpus": 6, "cuda_available": True,
           "torchrun": True}
    r = report(facts("node0", {}, gpu_count=8, gpu_source="/proc/driver/nvidia/gpus",
                     torch=gpu),
               facts("node1", {}, gpu_count=8, torch=dict(gpu, cuda_available=False,
                                                         version="2.13.0+cpu")))
    text = "\n".join(r.problems)
    assert "node0: torch sees 6 of the 8 GPUs (/proc/driver/nvidia/gpus)" in text
    assert "node1: 8 GPUs, but torch 2.13.0+cpu cannot use CUDA" in text
    assert r.backend == "nccl" and r.nproc(r.facts[0]) == 8


def test_the_shared_mount_the_inventory_describes() -> None:
    from orchestrator.checks.preflight import shared_spec

    def spec_of(**variables):
        return shared_spec(Cluster(inventory=Path("/site/hosts.yml"), nodes=(),
                                   shared_path="/mnt/cluster",
                                   variables=variables))

    assert spec_of() == {"path": "/mnt/cluster", "fstypes": ["nfs", "nfs4"]}
    assert spec_of(nfs_client_kernel_mount=False)["fstypes"] is None  # the sandbox: any mount
    assert spec_of(nfs_client_kernel_mount=False,
                   cluster_shared_fstypes=["lustre"])["fstypes"] == ["lustre"]


# --- nodes in use by others (node/busy.py) ------------------------------------------------

RUN = "20260101-120000-a1b2c3"
DOUBLES = Path(__file__).resolve().parents[1] / "node" / "nvidia_smi"


def judged(*f: NodeFacts, share_gpus: bool = False,
           queued: dict[str, list[int]] | None = None) -> Report:
    """F judged; QUEUED: a --queue run, given these GPUs of each node by Slurm."""
    r = Report(Cluster(inventory=Path("/site/hosts.yml"), nodes=tuple(x.node for x in f)),
               list(f), share_gpus=share_gpus, queued_gpus=queued)
    for x in f:
        x.resolve = {n.cluster_address: n.cluster_address for n in r.cluster.nodes}
    _judge(r, 29500, strict_port=False)
    return r


def test_a_node_with_another_users_run_is_refused_naming_user_and_run() -> None:
    """The CPU-node path: a live run of any user, this user's other runs too."""
    idle = Busy()
    r = judged(facts("node0", {}, busy=idle),
               facts("node1", {}, busy=Busy(runs=[LiveRun(RUN, "alice", [4242])])),
               facts("node2", {}, user="bob", busy=Busy(runs=[
                   LiveRun(RUN, "alice", [5151]), LiveRun("20260101-130000-d4e5f6", "bob",
                                                          [5252], kind="notebook")]
                                          )))
    assert r.problems == [
        f"node1 is in use by alice's run {RUN}. Wait for it to end or have it stopped "
        "(`python -m orchestrator runs` lists a user's runs, `python -m orchestrator stop "
        "RUN` stops one), or pass --share-gpus to run beside it",
        f"node2 is in use by alice's run {RUN}; bob's notebook 20260101-130000-d4e5f6. Wait for "
        "them to end or have them stopped (`python -m orchestrator runs` lists a user's "
        "runs, `python -m orchestrator stop RUN` stops one), or pass --share-gpus to run "
        "beside them"]
    assert r.warnings == []


def gpu_node() -> Busy:
    """What busy.scan makes of the recorded-format nvidia-smi doubles when PIDs 1838461 and
    1838462 are bob's run's workers, 2290117 is carol's notebook and 3011554 is not
    visible on the node (another container's)."""
    gpus = parse_gpus((DOUBLES / "query-gpu.4gpu.csv").read_text())
    rows = parse_apps((DOUBLES / "query-compute-apps.4gpu.csv").read_text(), gpus)
    for row in rows:
        if row.pid == 2290117:
            row.user, row.command = "carol", "/usr/bin/python3 -m jupyter lab"
    return Busy(runs=[LiveRun(RUN, "bob", [1838400], [0, 1])],
                gpu_processes=[g for g in rows if g.pid not in (1838461, 1838462)])


def test_a_node_whose_gpus_are_in_use_is_refused_naming_runs_processes_and_gpus() -> None:
    r = judged(facts("node0", {}), facts("node1", {}, busy=gpu_node()))
    [problem] = r.problems
    assert problem.startswith(
        f"node1 is in use by bob's run {RUN} on GPUs 0, 1; PID 2290117 of carol "
        "(/usr/bin/python3 -m jupyter lab) on GPUs 2, 3, 2560 MiB; PID 3011554 of a user "
        "not visible here on GPU 3. Wait for them to end"), problem
    assert problem.endswith("or pass --share-gpus to run beside them")


def test_share_gpus_runs_beside_them_with_a_warning() -> None:
    r = judged(facts("node0", {}, busy=Busy(runs=[LiveRun(RUN, "alice", [1])])),
               facts("node1", {}, busy=gpu_node()), share_gpus=True)
    assert r.problems == []
    assert r.warnings[0] == (f"node0 is in use by alice's run {RUN}; running beside it "
                             "(--share-gpus)")
    assert r.warnings[1].startswith(f"node1 is in use by bob's run {RUN} on GPUs 0, 1; ")


def slurm_node() -> Busy:
    """A node Slurm shares out: bob's queued run (a step of his Slurm job 41) on GPUs 0, 1,
    and a process of the run's own job 42 on GPU 2 (an srun of the user's, say)."""
    return Busy(runs=[LiveRun(RUN, "bob", [1838400], [0, 1], slurm_job="41")],
                gpu_processes=[GpuProcess(2290117, "GPU-2", 2, 512, "alice", "python x.py",
                                          slurm_job="42")])


def test_a_queued_run_beside_slurms_own_jobs_is_no_refusal_and_no_warning() -> None:
    """Slurm gave those jobs other GPUs of the node (issue 69: without --share-gpus)."""
    r = judged(facts("node0", {}, busy=slurm_node()), queued={"node0": [3]})
    assert (r.problems, r.warnings) == ([], [])


def test_a_queued_run_on_a_node_slurm_does_not_know_is_used_is_refused() -> None:
    """Issue 69: alice's run started without --queue holds node1's GPUs, which Slurm
    believes free; the queued run Slurm placed there does not start beside it unasked."""
    outside = Busy(runs=[LiveRun(RUN, "alice", [4242], [0, 1]),
                         LiveRun("20260101-130000-d4e5f6", "bob", [5151], [2],
                                 slurm_job="41")],
                   gpu_processes=[GpuProcess(3011554, "GPU-3", 3, 300, "carol", "python e.py")])
    r = judged(facts("node0", {}, busy=Busy()),
               facts("node1", {}, busy=outside), queued={"node1": [0]})
    assert r.warnings == []
    assert r.problems == [
        f"node1 is in use by alice's run {RUN} on GPUs 0, 1; PID 3011554 of carol "
        "(python e.py) on GPU 3, 300 MiB, started outside Slurm (without --queue): Slurm "
        "counts those GPUs free and gave this run the node beside them. Wait for them to "
        "end or have them stopped (`python -m orchestrator runs` lists a user's runs, "
        "`python -m orchestrator stop RUN` stops one) and run again, ask for other nodes "
        "(--hosts), or pass --share-gpus to run beside them"]
    shared = judged(facts("node1", {}, busy=outside), queued={"node1": [0]},
                    share_gpus=True)
    assert shared.problems == []
    assert shared.warnings == [f"node1 is in use by alice's run {RUN} on GPUs 0, 1; PID "
                               "3011554 of carol (python e.py) on GPU 3, 300 MiB, started "
                               "outside Slurm (without --queue); running beside them "
                               "(--share-gpus)"]


def test_a_queued_run_counts_a_process_it_cannot_trace_when_it_holds_the_runs_gpu() -> None:
    """Another user's process under hidepid (or another container's): its ancestry cannot
    be seen, so neither can its Slurm job. On a GPU Slurm gave the run it is outside Slurm
    for sure (Slurm gives a GPU to one job); on another GPU, it is only said."""
    unseen = Busy(gpu_processes=[GpuProcess(3011554, "GPU-3", 3, 300),
                                 GpuProcess(3011555, "GPU-1", 1, 100)], hidden=True)
    apart = judged(facts("node1", {}, busy=unseen), queued={"node1": [0, 2]})
    assert apart.problems == []
    assert apart.warnings[-1] == (
        "node1: PID 3011554 of a user not visible here on GPU 3, 300 MiB; PID 3011555 of a "
        "user not visible here on GPU 1, 100 MiB: whether Slurm knows of them cannot be "
        "told from here (not on this run's GPUs)")
    on_mine = judged(facts("node1", {}, busy=unseen), queued={"node1": [0, 1]})
    [problem] = on_mine.problems
    assert problem.startswith("node1 is in use by PID 3011555 of a user not visible here on "
                              "GPU 1, 100 MiB, started outside Slurm"), problem
    assert "3011554 of a user not visible here on GPU 3, 300 MiB: whether" in \
        on_mine.warnings[-1], on_mine.warnings


def test_a_run_without_the_queue_is_refused_beside_a_queued_one_naming_its_job() -> None:
    r = judged(facts("node0", {}, busy=slurm_node()))
    [problem] = r.problems
    assert problem.startswith(
        f"node0 is in use by bob's run {RUN} on GPUs 0, 1 (Slurm job 41); PID 2290117 of "
        "alice (python x.py) on GPU 2, 512 MiB (Slurm job 42). Wait for them"), problem


def test_gpus_that_cannot_be_read_and_hidden_processes_are_warned_about() -> None:
    r = judged(facts("node0", {}, busy=Busy(error="nvidia-smi --query-compute-apps=pid,"
                                            "gpu_uuid,used_memory: NVIDIA-SMI has failed",
                                            hidden=True)))
    assert r.problems == []
    assert r.warnings == [
        "node0: cannot tell whether its GPUs are in use: nvidia-smi --query-compute-apps="
        "pid,gpu_uuid,used_memory: NVIDIA-SMI has failed",
        "node0: other users' processes are hidden from alice (/proc is mounted with "
        "hidepid): their runs there cannot be seen"]


def own_env(f: NodeFacts, name: str = "proj") -> NodeFacts:
    """F as read from the user's own environment NAME (train --python-env NAME)."""
    f.node = Cluster(Path("/site/hosts.yml"), (f.node,)).with_user_env(name).nodes[0]
    return f


def test_drift_in_a_users_own_environment_names_it_and_env_create_puts_it_back() -> None:
    made = {"python": "3.11.2", "packages": {"torch": "2.13.0"}, "sha256": "p"}
    live = dict(made, packages={"torch": "2.13.0", "six": "1.17.0"}, sha256="l")
    r = report(own_env(facts("node0", {}, fingerprint=made, provisioned=made, user="bob")),
               own_env(facts("node1", {}, fingerprint=live, provisioned=made, user="bob")))
    [problem] = r.problems
    assert problem.splitlines()[0] == ("environment drift in bob's environment proj (read "
                                       "from each node's environment now):")
    assert "    node1 since provisioning: package six: absent when provisioned, 1.17.0 now" \
        in problem.splitlines()
    assert problem.splitlines()[-1].startswith(
        "  put it back on node1: python -m orchestrator env create -f ENVIRONMENT_FILE "
        "--name proj -i /site/hosts.yml")
    assert "site.yml" not in problem


def test_a_users_environment_missing_on_a_node_says_how_to_make_it() -> None:
    r = report(own_env(facts("node0", {"torch": "2.13.0"}, user="bob")),
               own_env(facts("node1", {}, fingerprint=None, python_env=None, user="bob",
                             python_env_error="/home/bob/.clustertrain/envs/proj/"
                             "python_env.json: no such file")))
    [problem] = r.problems
    assert problem.startswith("node1: bob's environment proj is not there (")
    assert "env create -f ENVIRONMENT_FILE --name proj" in problem
    assert r.cluster.nodes[0].env_state_dir == "~/.clustertrain/envs/proj"


CORDON = {"node": "node1", "action": "cordon", "why": "node1 lost mid-run r1 (heartbeat "
          "silent 15 s)", "by": "bob", "since": "2026-11-26T03:12:00+00:00", "time": 1.0}


def test_a_cordoned_node_is_refused_naming_why_since_when_and_the_way_back() -> None:
    r = judged(facts("node0", {}), facts("node1", {}, cordon=CORDON))
    assert r.problems == [
        "node1: cordoned since 2026-11-26T03:12:00+00:00 by bob: node1 lost mid-run r1 "
        "(heartbeat silent 15 s); leave it out (--hosts), or once it is fixed return it "
        "with `python -m orchestrator uncordon node1` (or run `doctor` on it: a clean "
        "doctor returns it)"]


def test_a_node_whose_health_check_fails_is_refused_though_the_record_lacks_it() -> None:
    """Its share stalls: its health check could not write the cordon to the share, and
    said it on the node's own disk (node/health.py's state), which the probe reads."""
    verdict = {"node": "node1", "since": 1764385920.0, "failing": [
        {"check": "share", "why": "the share /mnt/cluster did not answer within 10 s"}]}
    r = judged(facts("node0", {}), facts("node1", {}, health=verdict))
    assert r.problems == [
        "node1: cordoned since 2025-11-29T03:12:00+00:00 by its health check: health check: "
        "the share /mnt/cluster did not answer within 10 s; leave it out (--hosts): it "
        "returns by itself once its health check passes (`sudo systemctl start "
        "clustertrain-health` on it checks now)"]


def test_doctors_own_run_measures_a_cordoned_node_with_a_warning() -> None:
    r = Report(Cluster(inventory=Path("/site/hosts.yml"), nodes=(spec("node0"), spec("node1"))),
               [facts("node0", {}), facts("node1", {}, cordon=CORDON)], cordoned_ok=True)
    for x in r.facts:
        x.resolve = {n.cluster_address: n.cluster_address for n in r.cluster.nodes}
    _judge(r, 29500, strict_port=False)
    assert r.problems == [] and r.warnings == [
        "node1: cordoned since 2026-11-26T03:12:00+00:00 by bob: node1 lost mid-run r1 "
        "(heartbeat silent 15 s)"]


def place(what: str, path: str, free_gib: float, total_gib: float = 100.0,
          ifree: int = 500_000, itotal: int = 1_000_000) -> dict:
    return {"what": what, "path": path, "free": int(free_gib * 2**30),
            "total": int(total_gib * 2**30), "ifree": ifree, "itotal": itotal}


def test_too_little_space_is_refused_naming_the_place_and_nearly_full_is_a_warning() -> None:
    share = place("share", "/mnt/cluster", 1.5, 500)      # below the 2 GiB default
    r = report(facts("node0", {}, space=[share, place("home", "/home/alice", 50),
                                         place("tmp", "/tmp", 4, 100)]),
               facts("node1", {}, space=[share, place("home", "/home/alice", 0.5, 100),
                                         place("tmp", "/tmp", 8, 8, ifree=900)]))
    assert r.problems == [
        "the share /mnt/cluster has 1.5 GiB free of 500.0 GiB, below the 2 GiB a run needs "
        "there (cluster_min_free_gb): free some (checkpoints, datasets, the runs' snapshots; "
        "`clustertrain du` shows whose) or lower cluster_min_free_gb in the inventory",
        "node1: /home/alice has 512 MiB free of 100.0 GiB, below the 2 GiB a run needs there "
        "(cluster_min_free_gb): free some (environments under ~/.clustertrain, caches) or "
        "lower cluster_min_free_gb in the inventory",
        "node1: /tmp has 900 inodes free of 1000000, below 1000: remove files there "
        "(temporary files)"]
    assert r.warnings == ["node0: /tmp is nearly full: 4.0 GiB free of 100.0 GiB "
                          "(temporary files)"]


def test_a_nearly_full_share_names_its_biggest_users_as_its_server_counted_them() -> None:
    """The share's server counted who fills it 4 minutes ago (node/health.py users.json):
    the refusal names the three biggest, with their bytes and when; none counted: `du`."""
    share = place("share", "/mnt/cluster", 1.5, 500)
    counted = {"time": time.time() - 245, "free": 1, "total": 2,
               "users": {"alice": 300 << 30, "bob": 150 << 30, "carol": 40 << 30,
                         "dave": 9 << 30, "root": 0}}
    r = report(facts("node0", {}, space=[share], share_users=counted),
               facts("node1", {}, space=[share], share_users=counted))
    assert r.problems == [
        "the share /mnt/cluster has 1.5 GiB free of 500.0 GiB, below the 2 GiB a run needs "
        "there (cluster_min_free_gb): free some (checkpoints, datasets, the runs' snapshots; "
        "its biggest users 4 min ago: alice 300.0 GiB, bob 150.0 GiB, carol 40.0 GiB; "
        "`clustertrain du` shows what) or lower cluster_min_free_gb in the inventory"]
    warned = report(facts("node0", {}, space=[place("share", "/mnt/cluster", 20, 500)],
                          share_users=counted))
    assert warned.warnings == [
        "the share /mnt/cluster is nearly full: 20.0 GiB free of 500.0 GiB (checkpoints, "
        "datasets, the runs' snapshots; its biggest users 4 min ago: alice 300.0 GiB, bob "
        "150.0 GiB, carol 40.0 GiB; `clustertrain du` shows what)"]


def test_the_inventory_sets_the_space_a_run_needs() -> None:
    nodes = (spec("node0"),)
    f = facts("node0", {}, space=[place("home", "/home/alice", 1.0),
                                  {"what": "tmp", "path": "/tmp", "error": "Permission denied"}],
              resolve={"192.0.2.10": "192.0.2.10"})
    r = Report(Cluster(Path("/site/hosts.yml"), nodes,
                       variables={"cluster_min_free_gb": 0.5}), [f])
    _judge(r, 29500, strict_port=False)
    assert r.problems == [] and r.warnings == [
        "node0: /home/alice is nearly full: 1.0 GiB free of 100.0 GiB (environments under "
        "~/.clustertrain, caches)", "node0: /tmp: free space unknown (Permission denied)"]
