"""A real site: two researchers train at once, each as themselves, on the same three
nodes, reached by name through a bastion. Real SSH (OpenSSH with ProxyJump), real
torchrun with gloo across three containers, real Unix users."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ...cluster import ENV, REPO, ProvisionedCluster, wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.e2e, pytest.mark.timeout(1500)]
JOBS = Path(__file__).resolve().parents[1] / "jobs"
NODES = ("node0", "node1", "node2")
SMALL = ["--width", "8", "--batch-size", "32", "--log-every", "10"]


def orchestrator(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def start_train(inventory: Path, runs: Path, *args: str) -> subprocess.Popen:
    runs.mkdir(parents=True, exist_ok=True)
    out = open(runs.parent / f"{runs.name}.out", "w")
    return subprocess.Popen([sys.executable, "-m", "orchestrator", "train", "-i",
                             str(inventory), "--runs-dir", str(runs), *args],
                            cwd=REPO, env=ENV, stdout=out, stderr=subprocess.STDOUT, text=True)


def output(runs: Path) -> str:
    return (runs.parent / f"{runs.name}.out").read_text()



def owners(cluster: ProvisionedCluster, node: str) -> dict[str, set[str]]:
    """Users owning torchrun and training processes on NODE, by ps, as an admin sees them."""
    ps = cluster.exec(node, "ps", "-eo", "user:20,args", "--no-headers").stdout
    found: dict[str, set[str]] = {}
    for line in ps.splitlines():
        user, _, args = line.strip().partition(" ")
        if re.search(r"/torchrun --nnodes |python[\d.]* -u (\S*node\.py worker )?"
                     r"\S*(train|ddp_allreduce)\.py", args):
            found.setdefault(user, set()).add(args.strip()[:80])
    return found


def summary(runs: Path) -> dict:
    (path,) = runs.glob("*/summary.json")
    return json.loads(path.read_text())


@pytest.mark.long
def test_two_users_train_at_once_each_as_themselves(sandbox_cluster: ProvisionedCluster,
                                                    tmp_path: Path) -> None:
    alice_inv, bob_inv = sandbox_cluster.inventories["alice"], sandbox_cluster.inventories["bob"]
    alice_runs, bob_runs = tmp_path / "alice-runs", tmp_path / "bob-runs"
    # Started at the same moment: both preflights probe node 0's ports together. Each
    # shares the nodes knowingly (--share-gpus): without it, whichever preflight saw the
    # other's supervisors would refuse (test_busy_sandbox.py).
    alice = start_train(alice_inv, alice_runs, "--nodes", "3", "--share-gpus", "train.py",
                        "--", "--epochs", "2", "--run-name", "site-alice", *SMALL)
    bob = start_train(bob_inv, bob_runs, "--nodes", "3", "--share-gpus", "train.py", "--",
                      "--epochs", "2", "--run-name", "site-bob", *SMALL)
    try:
        # Both jobs run at once, on every node, each under its own user.
        def launched(runs: Path, proc: subprocess.Popen) -> bool:
            if "starting torchrun on node0, node1, node2" in output(runs):
                return True
            assert proc.poll() is None, (f"{runs.name}: train ended ({proc.returncode}) "
                                         f"before its launch:\n{output(runs)[-3000:]}")
            return False
        wait_for(lambda: launched(alice_runs, alice) and launched(bob_runs, bob), 300,
                 lambda: "both launches\n" + "\n".join(f"{r.name}: {output(r)[-1500:]}"
                                                         for r in (alice_runs, bob_runs)))

        def both_running() -> bool:
            return all({"alice", "bob"} <= set(owners(sandbox_cluster, n)) for n in NODES)
        wait_for(both_running, 300, lambda: "both users' training processes on all three "
                 f"nodes\n{output(alice_runs)[-1500:]}\n{output(bob_runs)[-1500:]}")
        for node in NODES:
            assert set(owners(sandbox_cluster, node)) == {"alice", "bob"}, node
        # bob can neither stop alice's run (refused before any node is touched) ...
        (alice_run,) = [p.name for p in alice_runs.iterdir() if (p / "run.json").exists()]
        refused = orchestrator("stop", alice_run, "--runs-dir", str(alice_runs), "-i",
                               str(bob_inv))
        assert refused.returncode != 0
        assert (f"run {alice_run} runs as alice on node0, and this inventory connects as bob: "
                "only alice (or root on the node) can stop it. Nothing was signalled"
                ) in refused.stderr, refused.stdout + refused.stderr
        assert not (alice_runs / alice_run / "stop-requested").exists()
        # ... nor look into her job state or checkpoints on the nodes.
        for path in ("/home/alice/.clustertrain", "/mnt/cluster/checkpoints/alice"):
            peek = sandbox_cluster.exec("node1", "runuser", "-u", "bob", "--", "ls", path,
                                        check=False)
            assert peek.returncode != 0 and "Permission denied" in peek.stderr, path
        assert alice.wait(timeout=900) == 0, output(alice_runs)[-4000:]
        assert bob.wait(timeout=900) == 0, output(bob_runs)[-4000:]
    finally:
        for proc in (alice, bob):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
    a, b = summary(alice_runs), summary(bob_runs)
    assert a["status"] == b["status"] == "succeeded"
    assert a["users"] == {n: "alice" for n in NODES} and b["users"] == {n: "bob" for n in NODES}
    # Two concurrent launches, two master ports: neither failed on "address in use".
    assert a["master"]["port"] != b["master"]["port"], (a["master"], b["master"])
    # Each user's checkpoints are that user's, and private by default.
    for user, uid in (("alice", 1001), ("bob", 1002)):
        ckpts = sandbox_cluster.checkpoints(f"site-{user}", user=user)
        files = sorted(ckpts.glob("ckpt-*.pt"))
        assert files, f"no checkpoint of {user}"
        for f in [ckpts, ckpts.parent, *files]:
            assert f.stat().st_uid == uid, f"{f} is owned by uid {f.stat().st_uid}"
        assert ckpts.parent.stat().st_mode & 0o077 == 0, "a user's checkpoints are private"
    for node in NODES:  # nothing left behind by either user
        assert owners(sandbox_cluster, node) == {}, node


def test_thirty_connections_through_the_bastion_at_once(
        sandbox_cluster: ProvisionedCluster) -> None:
    """The bastion's sshd keeps its default MaxStartups (10:30:100), as most do: beyond 10
    connections not yet logged in, it drops new ones at random, which is what 30 nodes
    connecting at once look like. Every connection is made all the same (a dropped one is
    tried again), and none is taken for a node that is down."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.cluster import ssh
    from orchestrator.cluster.inventory import load_cluster

    node = load_cluster(sandbox_cluster.inventory).nodes[0]

    def one(i: int) -> str | None:
        try:
            conn = ssh.connect(f"{node.name}-{i}", node.ssh)
        except Exception as exc:  # noqa: BLE001 - every failure is reported below
            return str(exc)
        try:
            return None if conn.run("true").exit_code == 0 else f"{i}: `true` failed"
        finally:
            conn.close()

    with ThreadPoolExecutor(max_workers=30) as pool:
        failed = [f for f in pool.map(one, range(30)) if f]
    assert not failed, f"{len(failed)} of 30 failed, e.g. {failed[0]}"


def test_an_unknown_user_is_named_before_anything_starts(sandbox_cluster: ProvisionedCluster,
                                                         tmp_path: Path) -> None:
    inventory = tmp_path / "carol.yml"
    inventory.write_text(sandbox_cluster.inventory.read_text().replace(
        "ansible_user: alice", "ansible_user: carol"))
    p = orchestrator("train", "-i", str(inventory), "--nodes", "2", "--runs-dir",
                     str(tmp_path / "runs"), "--workdir", str(JOBS), "ddp_allreduce.py")
    assert p.returncode != 0
    assert ("node0: SSH login as carol at carol@node0 was refused (carol@" in p.stderr
            and "check that the user exists on the node" in p.stderr), p.stdout + p.stderr
    assert "nothing was started" in p.stderr and not (tmp_path / "runs").exists()


def test_an_inventory_of_dns_names_only_trains(sandbox_cluster: ProvisionedCluster,
                                               tmp_path: Path) -> None:
    """No IP address anywhere on the controller's side: the ssh_config names only the
    bastion's address; the nodes are reached by their DNS names, which the bastion
    resolves (ProxyJump), and they find each other by name through the site's DNS."""
    state = sandbox_cluster.inventory.parent
    config = (state / "ssh_config").read_text()
    match = re.search(r"^Host bastion\n(?:    .*\n)+", config, re.M)
    assert match, config
    bastion = match.group(0)
    key = state / "id_ed25519"
    known = tmp_path / "known_hosts"
    # The nodes' host keys under their names (the host-key check stays on).
    lines = (state / "known_hosts").read_text().splitlines()
    by_ip = {v: k for k, v in sandbox_cluster.nodes.items()}
    known.write_text("\n".join([ln for ln in lines] + [
        f"{by_ip[ln.split()[0]]} {' '.join(ln.split()[1:])}" for ln in lines
        if ln.split()[0] in by_ip]) + "\n")
    (tmp_path / "ssh_config").write_text(
        bastion.replace(str(state / "known_hosts"), str(known)) +
        f"\nHost node*\n    User alice\n    IdentityFile {key}\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {known}\n    StrictHostKeyChecking yes\n"
        "    ProxyJump bastion\n")
    assert not re.search(r"Host node\S*\n(?:    .*\n)*    HostName",
                         (tmp_path / "ssh_config").read_text())
    inventory = tmp_path / "names.yml"
    inventory.write_text(
        "all:\n  vars:\n    ansible_user: alice\n"
        # the sandbox's share is a bind mount standing in for NFS (preflight checks the type)
        "    nfs_client_kernel_mount: false\n"
        f"    ansible_ssh_common_args: -F {tmp_path / 'ssh_config'}\n"
        "  children:\n    train_nodes:\n      hosts:\n"
        "        node0: {cluster_address: node0}\n        node1: {cluster_address: node1}\n")
    assert not re.search(r"\d+\.\d+\.\d+\.\d+", inventory.read_text())
    p = orchestrator("train", "-i", str(inventory), "--nodes", "2", "--runs-dir",
                     str(tmp_path / "runs"), "--workdir", str(JOBS), "ddp_allreduce.py")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "node1/rank1 | rank 1/2 host node1 sum 3 ok" in p.stdout
    # The master address is node0's name, resolved once on the nodes.
    s = summary(tmp_path / "runs")
    assert s["master"]["addr"] == sandbox_cluster.nodes["node0"]
