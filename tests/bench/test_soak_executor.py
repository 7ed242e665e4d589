"""The soak executor's parts that need no cluster (bench/soak/): each action as the command
line its user runs, each fault as the nemesis's commands, what a run may end as from what
the soak did to it, what the nodes' probes print read back, and the report rendered from a
fixed history and verdicts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from soak import expect, invariants as inv, nemesis, probe, report, slurm, workload  # noqa: E402
from soak.history import Attack, Event, RunSeen, Violation  # noqa: E402
from soak.plan import ATTACKS, FAULTS, USER_VERBS, Action, plan  # noqa: E402

NODES = ("node0", "node1", "node2", "node3")
USERS = ("alice", "bob", "carol", "dave")


def site(seed: int = 7) -> workload.Site:
    return workload.Site({u: Path(f"/s/inventory-{u}.yml") for u in USERS},
                         {u: Path(f"/s/ssh_config-{u}") for u in USERS}, NODES,
                         Path("/out/runs"), seed, python="py")


def after(argv: tuple[str, ...], option: str) -> str:
    return argv[argv.index(option) + 1]


@pytest.mark.parametrize("verb", ["train", "train-detach", "train-queue", "train-recover"])
def test_a_start_is_train_as_its_user_with_a_run_id_of_the_soaks(verb: str) -> None:
    action = Action(12.0, "carol", verb, {"nodes": 2}, ref="carol-3")
    command = workload.command_for(action, site())
    argv = command.argv
    assert argv[:4] == ("py", "-m", "orchestrator", "train")
    assert after(argv, "-i") == "/s/inventory-carol.yml"
    assert after(argv, "--runs-dir") == "/out/runs/carol"
    assert after(argv, "--run-id") == command.run_id == "soak7-carol-3"
    assert command.background and command.starts and command.user == "carol"
    assert "--share-gpus" not in argv   # a node in use is refused, as for a careful user
    assert ("--detach" in argv) == (verb in ("train-detach", "train-recover"))
    if verb == "train-queue":
        assert after(argv, "--nodes") == "2" and after(argv, "--gpus-per-node") == "1"
        assert "--hosts" not in argv   # Slurm chooses
    else:
        hosts = after(argv, "--hosts").split(",")
        assert len(hosts) == 2 and set(hosts) <= set(NODES) and command.hosts == tuple(hosts)
    if verb == "train-recover":
        spare = after(argv, "--spare-hosts")
        assert after(argv, "--max-recoveries") == "1" and spare not in command.hosts
    if verb in ("train", "train-recover"):   # checkpoints, named by the run
        assert "train.py" in argv and after(argv, "--run-name") == "soak7-carol-3"
    else:
        assert "ddp_allreduce.py" in argv and 20 <= int(after(argv, "--sleep")) <= 90
    # The same seed and action, the same command; another seed, other nodes somewhere.
    assert workload.command_for(action, site()) == command


def test_the_nodes_of_runs_are_the_seeds_and_spread() -> None:
    picks = {workload.hosts_for(site(), Action(0, "bob", "train", {"nodes": 1}, f"bob-{i}"))
             for i in range(20)}
    assert len(picks) >= 3
    assert [workload.hosts_for(site(s), Action(0, "bob", "train", {"nodes": 3}, "bob-1"))
            for s in (1, 1)] == [workload.hosts_for(site(1), Action(0, "bob", "train",
                                                                      {"nodes": 3}, "bob-1"))] * 2


def test_stop_attach_du_usage_cordon_as_their_users() -> None:
    s = site()
    stop = workload.command_for(Action(5, "dave", "stop", ref="dave-2"), s)
    assert stop.argv[3:] == ("stop", "soak7-dave-2", "--runs-dir", "/out/runs/dave", "-i",
                             "/s/inventory-dave.yml") and not stop.background
    attach = workload.command_for(Action(5, "dave", "attach", ref="dave-1"), s)
    assert attach.argv[3:] == ("attach", "soak7-dave-1", "--runs-dir", "/out/runs/dave")
    assert attach.background
    assert workload.command_for(Action(5, "bob", "du"), s).argv[3:] == (
        "du", "-i", "/s/inventory-bob.yml")
    assert workload.command_for(Action(5, "alice", "usage"), s).argv[3:] == (
        "usage", "-i", "/s/inventory-alice.yml", "--all")   # the admin sees everyone's
    cordon = workload.command_for(Action(5, "alice", "cordon"), s, node="node2")
    assert cordon.argv[3:5] == ("cordon", "node2") and "soak seed 7" in after(cordon.argv,
                                                                             "--why")
    assert workload.command_for(Action(5, "alice", "uncordon"), s, node="node2").argv[3:] == (
        "uncordon", "node2", "-i", "/s/inventory-alice.yml")


def test_the_pushers_attacks_use_the_pushers_login_on_the_victims_things() -> None:
    s = site()
    stop = workload.command_for(Action(9, "bob", "stop-anothers-run", {"victim": "carol"}), s,
                                target="soak7-carol-2")
    assert stop.argv[3:] == ("stop", "soak7-carol-2", "--runs-dir", "/out/runs/carol", "-i",
                             "/s/inventory-bob.yml")
    assert workload.breached(stop, 1, "only carol (or root on the node) can stop it") == []
    assert workload.breached(stop, 0, "stopped") == ["stop soak7-carol-2 of carol exited 0"]
    read = workload.command_for(Action(9, "bob", "read-anothers-checkpoints",
                                       {"victim": "dave"}), s, node="node1")
    assert read.argv[:3] == ("ssh", "-F", "/s/ssh_config-bob") and read.argv[-2] == "node1"
    assert "/mnt/cluster/checkpoints/dave" in read.argv[-1] and "/home/dave/" in read.argv[-1]
    assert workload.breached(read, 0, "") == []
    assert workload.breached(read, 0, "READ /home/dave/.clustertrain\n") == [
        "/home/dave/.clustertrain"]
    with pytest.raises(workload.NothingToAimAt, match="no live run"):
        workload.command_for(Action(9, "bob", "stop-anothers-run", {"victim": "carol"}), s)


def test_what_is_not_done_yet_says_so() -> None:
    done = {"train", "train-detach", "train-queue", "train-recover", "stop", "attach", "du",
            "usage", "cordon", "uncordon", "stop-anothers-run", "read-anothers-checkpoints"}
    for verb in [*USER_VERBS, "site-yml-new-env", *ATTACKS]:
        if verb in done:
            continue
        with pytest.raises(workload.NotImplementedYet, match=verb):
            workload.command_for(Action(1, "bob", verb, {"victim": "carol"}, "bob-1"), site())


CONTAINERS = {n: f"sb-{n}" for n in NODES}


def test_each_fault_and_its_heal() -> None:
    kill = nemesis.fault_for("kill-node", "node2", 25, "sb", CONTAINERS)
    assert kill.inject == (("podman", "stop", "-t", "0", "sb-node2"),)
    assert kill.heal == (("podman", "start", "sb-node2"),) and kill.hold == 25 and kill.wait_ssh
    fill = nemesis.fault_for("fill-tmp", "node1", 30, "sb", CONTAINERS)
    assert fill.inject[0][:4] == ("podman", "exec", "--privileged", "sb-node1")
    assert "remount,size=" in fill.inject[0][-1] and nemesis.FILL in fill.inject[0][-1]
    assert f"rm -f {nemesis.FILL}" in fill.heal[0][-1] and fill.hold == 30
    stall = nemesis.fault_for("stall-share", "node3", 40, "sb", CONTAINERS)
    assert stall.inject[0][1:] == ("-m", "orchestrator", "sandbox", "share-stall", "--name",
                                   "sb", "--seconds", "40", "--nodes", "node3")
    assert stall.heal == ()   # it returns once the share answers again
    ctl = nemesis.fault_for("restart-slurmctld", "node3", 10, "sb", CONTAINERS)
    assert ctl.inject == (("podman", "exec", "sb-node0", "systemctl", "restart", "slurmctld"),)
    assert nemesis.fault_for("kill-train-9", "", 0, "sb", CONTAINERS, pid=4242).inject == (
        ("kill", "-9", "4242"),)
    with pytest.raises(workload.NothingToAimAt, match="no `train`"):
        nemesis.fault_for("kill-train-9", "node0", 0, "sb", CONTAINERS)
    for kind in set(FAULTS) - {"kill-node", "fill-tmp", "stall-share", "restart-slurmctld",
                               "kill-train-9"}:
        with pytest.raises(workload.NotImplementedYet, match=kind):
            nemesis.fault_for(kind, "node0", 10, "sb", CONTAINERS)


def ev(t: float, actor: str, kind: str, what: str, result: str = "", **args: object) -> Event:
    return Event(t, actor, kind, what, dict(args), result)


def test_a_run_nothing_touched_may_only_succeed() -> None:
    history = [ev(5, "bob", "invoke", "train", run="r1"),
               ev(30, "nemesis", "fault", "kill-node", node="node3"),      # not its node
               ev(200, "nemesis", "fault", "kill-node", node="node1")]     # after its end
    got = expect.expected("r1", "bob", "train", ["node0", "node1"], 5, 90, history)
    assert got == expect.Expected(("succeeded",), False, (), ())


def test_what_the_soak_did_to_a_run_widens_its_end_states() -> None:
    history = [ev(5, "bob", "invoke", "train-recover", run="r1"),
               ev(30, "nemesis", "fault", "kill-node", node="node1"),
               ev(40, "carol", "invoke", "stop", run="r1"),                # not hers: nothing
               ev(50, "bob", "fail", "stop-anothers-run", "refused: only carol", run="r1")]
    got = expect.expected("r1.r1", "bob", "train-recover", ["node0", "node1"], 5, None,
                          history, chain=("r1",))
    assert got.allowed == ("succeeded", "failed") and got.may_recover
    assert got.changed_by == () and got.why == ("30 s: kill-node on node1",)
    # The first attempt, which a recovery followed, ends failed; it does not recover itself.
    first = expect.expected("r1", "bob", "train-recover", ["node0", "node1"], 5, 35, history,
                            last_attempt=False)
    assert "failed" in first.allowed and not first.may_recover
    # Its user's stop, the soak's own stop at the end, a kill -9 of its train.
    history += [ev(60, "bob", "invoke", "stop", run="r1"),
                ev(70, "nemesis", "fault", "kill-train-9", run="r1"),
                ev(80, "soak", "invoke", expect.STOP_AT_END, run="r1")]
    got = expect.expected("r1", "bob", "train", ["node0"], 5, None, history)
    assert set(got.allowed) == {"succeeded", "stopped", "controller-lost", "failed",
                                "interrupted"}
    assert got.changed_by == ("bob",) and not got.may_recover


def test_an_attack_that_got_through_counts_its_attacker_among_the_changers() -> None:
    history = [ev(50, "bob", "ok", "stop-anothers-run",
                  f"{expect.BREACHED}: stop r1 of carol exited 0", run="r1")]
    got = expect.expected("r1", "carol", "train", ["node0"], 5, 90, history)
    assert got.changed_by == ("bob",)
    seen = inv.Seen(runs=[RunSeen("r1", "carol", "stopped", 5, 90, changed_by=got.changed_by)],
                    admins=frozenset({"alice"}),
                    attacks=[Attack(50, "bob", "carol", "read-anothers-checkpoints",
                                    ("/home/carol/.clustertrain",))])
    results = inv.check(seen)
    assert [v.what for v in results["nobody_changed_anothers_run"]] == ["bob changed r1 of carol"]
    assert [v.what for v in results["attacks_got_nothing"]] == [
        "bob's read-anothers-checkpoints against carol got /home/carol/.clustertrain"]


def test_the_nodes_probes_are_read_back() -> None:
    scan = ("1234 carol soak1-carol-2 51200 4 17 /opt/clustertrain/venv/bin/python -m "
            "orchestrator.node supervise x\n"
            "1300 carol soak1-carol-2 8000 2 9 /opt/venv/bin/python /opt/venv/bin/torchrun "
            "--nnodes 2\nnot a line\n")
    found = probe.parse_scan(scan, "node1", 60.0)
    assert [(p.pid, p.user, p.run_id, p.node) for p, _ in found] == [
        (1234, "carol", "soak1-carol-2", "node1"), (1300, "carol", "soak1-carol-2", "node1")]
    assert [(s.what, s.rss, s.threads, s.fds) for _, s in found] == [
        ("supervisor node1 soak1-carol-2", 51200 * 1024, 4, 17),
        ("torchrun node1 soak1-carol-2", 8000 * 1024, 2, 9)]
    assert "runuser -u dave" in probe.scan_script(["bob", "dave"])
    daemons = probe.parse_daemons("slurmd 88 4096 3 12\nbogus\n", "node0", 5.0)
    assert [(s.what, s.rss, s.threads, s.fds) for s in daemons] == [
        ("slurmd node0", 4096 * 1024, 3, 12)]


def test_the_shares_records_leave_out_data_wheels_and_checkpoints(tmp_path: Path) -> None:
    for path, size in (("data/cifar10/x.bin", 1000), ("wheelhouse/t.whl", 1000),
                       ("checkpoints/bob/r/ckpt-1.pt", 1000),
                       ("checkpoints/bob/.clustertrain/runs/r/state.json", 10),
                       ("cordons/node1.json", 5)):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"x" * size)
    assert probe.records_bytes(tmp_path) == 15


def test_slurms_gpus_and_accounting_are_read_back() -> None:
    text = ("JOB 41\nNodes=node[1-2] CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:1)\n"
            "JOB 42\nNodes=node0 CPU_IDs=0-1 Mem=0 GRES=gpu:2(IDX:0-1)\n")
    assert slurm.parse_running_gpus(text) == [("41", "node1", {1}), ("41", "node2", {1}),
                                              ("42", "node0", {0, 1})]
    assert slurm.expand_hosts("node[0-1,3],bastion") == ["node0", "node1", "node3", "bastion"]
    t0 = 1_700_000_000.0
    from datetime import datetime
    start = datetime.fromtimestamp(t0 + 10).isoformat(timespec="seconds")
    end = datetime.fromtimestamp(t0 + 70).isoformat(timespec="seconds")
    sacct = (f"41|bob|node[1-2]|{start}|{end}|billing=2,cpu=2,gres/gpu=2,node=2\n"
             f"42|carol|node0|{start}|Unknown|cpu=2,gres/gpu=2,node=1\n"
             f"43|carol|node0|{start}|{end}|cpu=2,node=1\n")
    assert slurm.parse_sacct(sacct, t0) == [("41", 10.0, 70.0), ("42", 10.0, None)]


def test_the_report_shows_the_seed_each_verdict_its_evidence_and_what_is_not_done() -> None:
    history = [ev(1, "bob", "invoke", "train", run="r1", cmd="python -m orchestrator train"),
               ev(40, "nemesis", "fault", "kill-node", "", node="node1", for_s=20),
               ev(60, "nemesis", "heal", "kill-node", "node1 answers (running)", node="node1"),
               ev(62, "bob", "fail", "train", "error: node1 lost", run="r1", code=1),
               ev(70, "carol", "info", "sweep", f"{report.NOT_IMPLEMENTED}: sweep: later"),
               ev(3700, "dave", "ok", "du", "done")]
    runs = [RunSeen("r1", "bob", "failed", 1, 62, ("node0", "node1"), allowed=("succeeded",)),
            RunSeen("r2", "dave", "succeeded", 3650, 3720)]
    results: dict[str, list[Violation]] = {name: [] for name in inv.INVARIANTS}
    results["ends_as_it_happened"] = [Violation(
        "ends_as_it_happened", "r1 of bob ended 'failed'; what happened to it allows "
        "succeeded", 62.0, {"run": "r1", "status": "failed", "allowed": ("succeeded",)})]
    soak = report.Soak(7, 61, "soak1", "python -m bench.soak.run --seed 7 --minutes 61",
                       "2026-12-08T02:40:00+00:00")
    page = report.render(soak, results, history, runs)
    assert "Soak, seed 7: <span class='broken'>1 violation(s)</span>" in page
    assert "python -m bench.soak.run --seed 7 --minutes 61" in page
    assert "r1 of bob ended &#x27;failed&#x27;" in page
    # The actions and faults around the violation, as history.around gives them.
    assert "40.0 s  nemesis  fault  kill-node for_s=20 node=node1" in page
    assert "Not done: 1 action(s)" in page and "<li>sweep: 1</li>" in page
    assert "<td>0</td><td>1: failed 1</td>" in page and "<td>1</td><td>1: succeeded 1</td>" in page
    data = report.verdicts_json(soak, results, history, runs)
    json.dumps(data)   # it is JSON
    assert data["held"] is False and data["soak"]["seed"] == 7
    found = data["invariants"]["ends_as_it_happened"]
    assert not found["held"] and found["violations"][0]["around"][0].startswith("      1.0 s")
    assert data["invariants"]["bounded"] == {"held": True, "violations": []}
    assert data["not_implemented"] == [history[4].line()]
    assert data["counts"]["kill-node"] == {"fault": 1}
    assert data["counts"]["train"] == {"fail": 1}
    assert data["runs_per_hour"] == {0: {"failed": 1}, 1: {"succeeded": 1}}


def test_an_hour_of_the_plan_maps_to_commands_or_says_why_not() -> None:
    """Every action of an hour's schedule is a command, or NotImplementedYet: none is lost."""
    s = site(3)
    for action in plan(3, 3600):
        if action.actor == "nemesis":
            continue
        try:
            command = workload.command_for(action, s, node="node1", target="soak3-carol-1")
        except workload.NotImplementedYet as exc:
            assert action.verb in str(exc)
            continue
        assert command.user == action.actor and command.argv


def test_a_start_refused_because_the_soaks_runs_held_its_nodes_may_end_failed() -> None:
    """A queued run refused at its preflight (a run beside the queue held a node Slurm gave
    it) leaves a record that ends failed: the soak's own runs caused it."""
    said = ("node2 is in use by bob's run soak1-bob-1, started outside Slurm (without "
            "--queue): Slurm counts those GPUs free and gave this run the node beside it.")
    history = [ev(22, "carol", "invoke", "train-queue", run="r1"),
               ev(46, "carol", "fail", "train-queue", said, run="r1", code=2)]
    got = expect.expected("r1", "carol", "train-queue", [], 22, 23, history)
    assert got.allowed == ("succeeded", "failed")
    # Any other failure of the start is not explained by what the soak did.
    history[1] = ev(46, "carol", "fail", "train-queue", "error: node2 lost", run="r1", code=1)
    assert expect.expected("r1", "carol", "train-queue", [], 22, 23, history).allowed == (
        "succeeded",)
