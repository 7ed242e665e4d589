"""The health role's promise on the real-site sandbox: a timer on every node runs the
node's health check; a node whose share stalls longer than the check's limit is cordoned
(drained in Slurm, refused by preflight, shown by `nodes`) and comes back once the share
answers; nvidia-smi reporting an uncorrected ECC error (its test double: no GPU here)
cordons the node in the share's record until it is gone, an Xid in the kernel's log (its
journalctl's test double) until an admin lifts it; bob writes no node's history.

The sandbox's timer runs once a day (sandbox/group_vars/all.yml: other tests stall the
share on purpose), so these tests start the check as the timer does: `systemctl start` of
the timer's service."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from orchestrator.node import health

from ..cluster import ProvisionedCluster, orchestrator, wait_for
from ..orchestrator.checks.test_preflight_sandbox import playbook, share_mount
from ..security.conftest import as_user

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]
LIMIT = 10.0   # roles/health's health_share_timeout default
DOUBLE_DIR = "/usr/local/lib/clustertrain-test"


def check_now(cluster: ProvisionedCluster, node: str) -> str:
    """Run NODE's health check as its timer does; what it said."""
    done = cluster.exec(node, "systemctl", "start", health.UNIT, check=False)
    assert done.returncode == 0, done.stderr
    return cluster.exec(node, "journalctl", "-u", health.UNIT, "-n", "1", "-o", "cat",
                        "--no-pager", "-g", f"^{node}: ").stdout.strip()


def nodes(cluster: ProvisionedCluster) -> dict[str, dict]:
    """alice's `nodes --json`, by node."""
    done = orchestrator("nodes", "--json", "-i", str(cluster.inventories["alice"]),
                        timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {n["name"]: n for n in json.loads(done.stdout)["nodes"]}


def drain_of(cluster: ProvisionedCluster, node: str) -> str:
    return cluster.exec("node0", "sinfo", "-h", "-n", node, "-o", "%t %E").stdout.strip()


def test_the_timer_runs_the_check_on_every_node(sandbox_cluster: ProvisionedCluster) -> None:
    for node in sandbox_cluster.nodes:
        enabled = sandbox_cluster.exec(node, "systemctl", "is-enabled", f"{health.UNIT}.timer",
                                       check=False).stdout.strip()
        active = sandbox_cluster.exec(node, "systemctl", "is-active", f"{health.UNIT}.timer",
                                      check=False).stdout.strip()
        assert (enabled, active) == ("enabled", "active"), node
        due = sandbox_cluster.exec(node, "systemctl", "show", f"{health.UNIT}.timer", "-p",
                                   "NextElapseUSecMonotonic", "--value").stdout.strip()
        assert due and due != "n/a", f"{node}: the timer has no next run ({due!r})"


def test_a_stalled_share_cordons_its_node_until_it_answers_again(
        sandbox_cluster: ProvisionedCluster) -> None:
    node = "node2"
    started = time.time()
    stall = threading.Thread(target=sandbox_cluster.stall_share, args=(LIMIT * 4, [node]))
    stall.start()
    try:
        # The stall has begun: looking up a name never asked before blocks (a listing may
        # be answered from the kernel's cache without the FUSE daemon).
        wait_for(lambda: sandbox_cluster.exec(
            node, "timeout", "-s", "KILL", "1", "stat", f"/mnt/cluster/.probe-{time.time_ns()}",
            check=False).returncode == 137, 20,
            lambda: f"the share to stall on {node}, whose /mnt/cluster is "
                    f"{share_mount(sandbox_cluster, node)!r} (the FUSE passthrough stops)")
        said = check_now(sandbox_cluster, node)
        assert f"the share /mnt/cluster did not answer within {LIMIT:g} s" in said, said
        assert drain_of(sandbox_cluster, node).startswith("drain"), \
            drain_of(sandbox_cluster, node)
        assert "clustertrain (health check): the share" in drain_of(sandbox_cluster, node)
        view = nodes(sandbox_cluster)[node]   # read from node0, whose share answers
        assert view["state"] == "failing", view
        assert "did not answer" in view["verdict"]["failing"][0]["why"]
    finally:
        stall.join()
    assert check_now(sandbox_cluster, node) == f"{node}: healthy"
    assert not drain_of(sandbox_cluster, node).startswith("drain"), drain_of(sandbox_cluster, node)
    view = nodes(sandbox_cluster)[node]
    assert view["state"] == "ok", view
    events = [e["event"] for e in view["events"] if e["time"] >= started]
    assert events == ["failing", "passing"], view["events"]


# TEST DOUBLES (no GPU in the sandbox, and a container reads no kernel log of its own):
# nvidia-smi with one GPU, its uncorrected ECC count read from a file the test writes, and
# journalctl whose kernel's Xid lines are those the test writes; each answers the health
# check's query only.
SMI_DOUBLE = f"""#!/bin/sh
if [ "$1" = "--query-gpu={','.join(health.SMI_FIELDS)}" ] && [ $# -eq 2 ]; then
    echo "0, $(cat {DOUBLE_DIR}/ecc), No, No, No"
    exit 0
fi
echo "nvidia-smi test double: no answer to: $*" >&2
exit 2
"""
JOURNAL_DOUBLE = f"""#!/bin/sh
case " $* " in *" -k "*"NVRM: Xid"*) cat {DOUBLE_DIR}/kernel.log; exit 0;; esac
echo "journalctl test double: no answer to: $*" >&2
exit 2
"""


def test_gpu_errors_cordon_the_node_an_ecc_error_until_it_is_gone_an_xid_until_an_admin_lifts_it(
        sandbox_cluster: ProvisionedCluster) -> None:
    node = "node1"
    alice, bob = (str(sandbox_cluster.inventories[u]) for u in ("alice", "bob"))
    raw = sandbox_cluster.exec(node, "cat", health.CONFIG).stdout   # put back byte for byte
    doubled = {**json.loads(raw), "nvidia_smi": f"{DOUBLE_DIR}/nvidia-smi",
               "journalctl": f"{DOUBLE_DIR}/journalctl"}
    sandbox_cluster.exec(node, "sh", "-c", f"mkdir -p {DOUBLE_DIR} && cat > "
                         f"{DOUBLE_DIR}/nvidia-smi <<'EOF'\n{SMI_DOUBLE}EOF\n"
                         f"cat > {DOUBLE_DIR}/journalctl <<'EOF'\n{JOURNAL_DOUBLE}EOF\n"
                         f"chmod 755 {DOUBLE_DIR}/nvidia-smi {DOUBLE_DIR}/journalctl && "
                         f"echo 1 > {DOUBLE_DIR}/ecc && : > {DOUBLE_DIR}/kernel.log && "
                         f"cat > {health.CONFIG} <<'EOF'\n{json.dumps(doubled)}\nEOF")
    try:
        said = check_now(sandbox_cluster, node)
        assert "GPU 0: 1 uncorrected ECC error(s)" in said, said
        listed = orchestrator("cordon", "-i", alice, timeout=120)
        assert listed.returncode == 0, listed.stderr
        [line] = [x for x in listed.stdout.splitlines() if x.startswith(f"{node} ")]
        assert "health check: GPU 0: 1 uncorrected ECC error(s)" in line, line
        refused = orchestrator("preflight", "-i", alice, "--hosts", f"node0,{node}",
                               timeout=300)
        assert refused.returncode != 0
        assert (f"{node}: cordoned since" in refused.stdout + refused.stderr
                and "it returns by itself once its health check passes"
                in refused.stdout + refused.stderr), refused.stdout[-3000:]
        assert "clustertrain (health check)" in drain_of(sandbox_cluster, node)
        # bob cannot write a node's history, nor add one
        for script in (f"echo '{{}}' >> /mnt/cluster/health/{node}.jsonl",
                       "touch /mnt/cluster/health/node9.jsonl"):
            forged = as_user(sandbox_cluster, "node0", "bob", script)
            assert forged.returncode != 0 and "Permission denied" in forged.stderr, script
        sandbox_cluster.exec(node, "sh", "-c", f"echo 0 > {DOUBLE_DIR}/ecc")   # a GPU reset
        assert check_now(sandbox_cluster, node) == f"{node}: healthy"
        listed = orchestrator("cordon", "-i", alice, timeout=120)
        assert not [x for x in listed.stdout.splitlines() if x.startswith(f"{node} ")], \
            listed.stdout
        assert "clustertrain (health check)" not in drain_of(sandbox_cluster, node)
        # The kernel says once that a GPU fell off the bus: the node stays cordoned at the
        # checks after it, until an admin (alice, in the sudo group) lifts it; bob may not.
        xid = ("NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has "
               "fallen off the bus.")
        sandbox_cluster.exec(node, "sh", "-c", f"echo \"{xid}\" > {DOUBLE_DIR}/kernel.log")
        said = check_now(sandbox_cluster, node)
        assert "GPU 0000:18:00: Xid 79 (fallen off the bus) in the kernel's log" in said, said
        sandbox_cluster.exec(node, "sh", "-c", f": > {DOUBLE_DIR}/kernel.log")
        assert "Xid 79" in check_now(sandbox_cluster, node)
        assert "clustertrain (health check)" in drain_of(sandbox_cluster, node)
        refused = orchestrator("uncordon", node, "-i", bob, timeout=120)
        assert refused.returncode != 0, refused.stdout
        assert "Xid 79" in check_now(sandbox_cluster, node)
        lifted = orchestrator("uncordon", node, "-i", alice, timeout=120)
        assert lifted.returncode == 0, lifted.stdout + lifted.stderr
        assert check_now(sandbox_cluster, node) == f"{node}: healthy"
        assert "clustertrain (health check)" not in drain_of(sandbox_cluster, node)
    finally:
        sandbox_cluster.exec(node, "sh", "-c", f"printf '%s' '{raw}' > {health.CONFIG} && "
                             f"rm -rf {DOUBLE_DIR} {health.STATE_DIR}/state.json",
                             check=False)
        check_now(sandbox_cluster, node)


WAITS = """\
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.5)
print("done waiting", flush=True)
"""


# The nvidia_driver role's part once a new kernel module is installed (installing one needs
# a GPU): its reboot tasks, as gpu.yml includes them.
DRIVER_REBOOT = """\
- name: The NVIDIA driver's reboot, after a new kernel module
  hosts: node2
  become: true
  gather_facts: false
  tasks:
    - name: Reboot, now or once the node's work has ended
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: reboot
      vars:
        __nvidia_driver_installed_version: "999.1"
"""


def test_a_reboot_waits_for_the_nodes_runs_then_the_node_returns(
        sandbox_cluster: ProvisionedCluster, tmp_path) -> None:
    """What roles/nvidia_driver does when a new kernel module needs a reboot and the node
    has work on it: its reboot tasks ask the health check (`health.py --defer-reboot`),
    which cordons and drains the node at once; the checks leave it up while alice's queued
    run lives on it, the first check after the run ended reboots it, and the first check
    after the boot returns it. The reboot is a TEST DOUBLE (a command that notes that it
    ran; rebooting a container of the shared cluster would end the other tests' node), and
    so is the boot (the request's boot id made a former one)."""
    from ..orchestrator.run.test_train_sandbox import Train

    node = "node2"
    raw = sandbox_cluster.exec(node, "cat", health.CONFIG).stdout   # put back byte for byte
    noted = f"{health.STATE_DIR}/rebooted-by-the-test"
    doubled = {**json.loads(raw), "reboot": ["/bin/sh", "-c", f"date >> {noted}"]}
    sandbox_cluster.exec(node, "sh", "-c", f"cat > {health.CONFIG} <<'EOF'\n"
                         f"{json.dumps(doubled)}\nEOF")
    work = tmp_path / "work"
    work.mkdir()
    (work / "waits.py").write_text(WAITS)
    driver_reboot = tmp_path / "driver-reboot.yml"
    driver_reboot.write_text(DRIVER_REBOOT)
    done = sandbox_cluster.checkpoints(tmp_path.name) / "done"
    done.parent.mkdir(parents=True, exist_ok=True)
    run = Train(sandbox_cluster, tmp_path / "runs", "--workdir", str(work), "--queue",
                "--nodes", "3", "--gpus-per-node", "1", "waits.py", "--",
                f"/mnt/cluster/checkpoints/alice/{tmp_path.name}/done")
    pending = f"{health.STATE_DIR}/{health.REBOOT_PENDING}"
    try:
        run.wait_for("starting torchrun on node0, node1, node2")
        play = playbook(str(driver_reboot), "-i", str(sandbox_cluster.inventory))
        assert play.returncode == 0, play.stdout[-4000:] + play.stderr[-2000:]
        report = re.search(r'"msg": "(node2: kernel module 999.1 is installed; .*)"',
                           play.stdout)
        assert report, play.stdout[-4000:]
        assert re.search(r"the node runs (.*; )?Slurm job \d+ of alice", report[1]), report[1]
        assert re.search(r"; run \S+ of alice", report[1]), report[1]
        assert "It is cordoned (and drained in Slurm) now" in report[1], report[1]
        assert re.search(r"Reboot to load the new kernel module\] \**\s*skipping: \[node2\]",
                         play.stdout), play.stdout[-4000:]
        assert "clustertrain (health check): the NVIDIA driver 999.1 is installed" \
            in drain_of(sandbox_cluster, node)
        # Nobody else is given the node meanwhile: bob's preflight is refused, naming why.
        refused = orchestrator("preflight", "-i", str(sandbox_cluster.inventories["bob"]),
                               "--hosts", f"node0,{node}", timeout=300)
        assert refused.returncode != 0
        assert "node2: cordoned since" in refused.stdout and (
            "the NVIDIA driver 999.1 is installed and loads at the reboot: it reboots once "
            "nothing runs on it; leave it out (--hosts): it returns by itself"
        ) in refused.stdout, refused.stdout[-3000:] + refused.stderr
        said = check_now(sandbox_cluster, node)
        assert "failing: the NVIDIA driver 999.1" in said, said
        assert sandbox_cluster.exec(node, "test", "-e", noted, check=False).returncode != 0, \
            "rebooted under alice's run"
        done.touch()
        assert run.finish() == 0, run.text[-3000:] + run.stderr
        assert "done waiting" in run.text
        wait_for(lambda: not sandbox_cluster.exec(node, "squeue", "-h", "-w", node).stdout
                 .strip(), 60, f"Slurm to end the run's job on {node}")
        check_now(sandbox_cluster, node)
        assert sandbox_cluster.exec(node, "cat", noted, check=False).stdout.count("\n") == 1, \
            "not rebooted once the run ended"
        assert drain_of(sandbox_cluster, node).startswith("drain")   # until it is back
        # The boot: the request was made in a former one.
        request = json.loads(sandbox_cluster.exec(node, "cat", pending).stdout)
        sandbox_cluster.exec(node, "sh", "-c", f"cat > {pending} <<'EOF'\n"
                             f"{json.dumps({**request, 'boot': 'a former boot'})}\nEOF")
        assert check_now(sandbox_cluster, node) == f"{node}: healthy"
        assert not drain_of(sandbox_cluster, node).startswith("drain"), \
            drain_of(sandbox_cluster, node)
        assert sandbox_cluster.exec(node, "test", "-e", pending, check=False).returncode != 0
        view = nodes(sandbox_cluster)[node]
        assert view["state"] == "ok", view
        assert [e["event"] for e in view["events"]][-3:] == ["failing", "rebooting", "passing"]
    finally:
        if run.proc.poll() is None:
            run.proc.terminate()
            run.finish(timeout=120)
        sandbox_cluster.exec(node, "sh", "-c", f"printf '%s' '{raw}' > {health.CONFIG} && "
                             f"rm -f {pending} {noted}", check=False)
        check_now(sandbox_cluster, node)
        done.unlink(missing_ok=True)
