"""bob against alice's run through its supervisors' ring: what he can see of it (the run
id, the nodes and their addresses on `ps`, her ring ports in /proc/net/udp) is enough to
write a beat of every kind, from every node, naming every node. None of them may stop,
fail or cordon her run: each is rejected (it carries no MAC under the run's key) and
logged with its source. Real supervisors, real UDP between three containers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ..cluster import ProvisionedCluster, wait_for
from ..orchestrator.run.test_supervision_sandbox import JOBS, NODES, cli, left
from .conftest import as_user

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]

# What bob runs on a node: `see` prints what any user sees of alice's run there; `send`
# writes every kind of news a beat carries, naming each node, to each of her ring ports.
BOB = r'''
import json, os, pwd, socket, sys
if sys.argv[1] == "see":
    uid, ports, argv = pwd.getpwnam("alice").pw_uid, [], None
    for line in open("/proc/net/udp").readlines()[1:]:
        f = line.split()
        if int(f[7]) == uid:
            ports.append(int(f[1].split(":")[1], 16))
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = [a.decode() for a in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")]
        except OSError:
            continue
        if "supervise" in args and "--run" in args:
            argv = args
    print(json.dumps({"ports": ports, "argv": argv}))
else:
    spec = json.load(sys.stdin)
    nodes = spec["nodes"]
    def news(other):
        return [{"s": {other: {"state": "ended", "reason": r, "code": c, "v": 10**6}}}
                for r, c in (("exited", 1), ("supervisor-failed", 1), ("stopped", 143))] + [
                {"s": {other: {"state": "running", "hang": "dumped", "v": 10**6}}},
                {"l": {other: {"by": nodes[0], "silent_s": 20, "heard_at": None}}}]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sent = 0
    for address, port in spec["targets"]:
        for name in nodes:
            for other in nodes:
                for word in news(other):
                    beat = {"r": spec["run"], "n": name, "c": 10**9, "q": 0.0, "s": {},
                            "l": {}, **word}
                    data = json.dumps(beat).encode()
                    for datagram in (data, bytes(32) + data):
                        s.sendto(datagram, (address, port))
                        sent += 1
    print(sent)
'''


def bob(cluster: ProvisionedCluster, node: str, *args: str, stdin: str = "") -> str:
    prog = cluster.share / f".bob-{time.monotonic_ns()}.py"   # readable by bob, gone after
    prog.write_text(BOB)
    try:
        done = as_user(cluster, node, "bob", f"python3 /mnt/cluster/{prog.name} "
                       + " ".join(args), stdin=stdin)
    finally:
        prog.unlink()
    assert done.returncode == 0, done.stderr
    return done.stdout


def supervisor_log(cluster: ProvisionedCluster, node: str, run: str) -> str:
    return cluster.exec(node, "cat", f"/home/alice/.clustertrain/jobs/{run}/supervisor.log",
                        check=False).stdout


def test_forged_beats_from_every_node_stop_fail_or_cordon_nothing(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    cordons = sandbox_cluster.share / "cordons"
    before = set(cordons.iterdir())
    p = cli(sandbox_cluster, tmp_path, "train", "-i", str(sandbox_cluster.inventory),
            "--workdir", str(JOBS), "--detach", "--nodes", "3", "--max-recoveries", "1",
            "--min-nodes", "2", "--share-gpus", "ddp_allreduce.py", "--", "--steps", "2",
            "--sleep", "120")
    assert p.returncode == 0, p.stdout + p.stderr
    (run,) = [d.name for d in tmp_path.iterdir() if (d / "run.json").exists()]
    try:
        wait_for(lambda: set(left(sandbox_cluster, tmp_path)) == set(NODES), 180,
                 "the run on all three nodes")
        seen = {n: json.loads(bob(sandbox_cluster, n, "see")) for n in NODES}
        argv = seen["node1"]["argv"]
        assert argv and argv[argv.index("--run") + 1] == run   # ps shows bob the run
        nodes = argv[argv.index("--nodes") + 1].split(",")
        addresses = argv[argv.index("--addresses") + 1].split(",")
        targets = [[a, port] for n, a in zip(nodes, addresses, strict=True)
                   for port in seen[n]["ports"]]
        assert len(targets) >= 3, seen
        spec = json.dumps({"run": run, "nodes": nodes, "targets": targets})
        for node in NODES:   # from every node: each source address is a member's
            assert int(bob(sandbox_cluster, node, "send", stdin=spec)) > 0
        time.sleep(5)   # past any news a node would have passed on
        assert set(left(sandbox_cluster, tmp_path)) == set(NODES), "the run stopped"
        for node in NODES:
            assert "rejected a datagram from" in supervisor_log(sandbox_cluster, node, run)
    finally:
        cli(sandbox_cluster, tmp_path, "stop", run)
        wait_for(lambda: not left(sandbox_cluster, tmp_path), 60, "the run stopped")
        made = set(cordons.iterdir()) - before
        for path in made:   # the other tests share these nodes: as an admin would
            path.unlink()
    assert not made, "a node was cordoned"
