"""`preflight`: are the chosen nodes ready to run a job together? One row per node.

Everything is read as it is now, on every node: the environment (a fingerprint from its
metadata, compared across nodes and with the one written at provisioning; torch imported
only when it changed), GPUs, the shared path (mounted as the inventory says, writable by
the job's user, one filesystem for all nodes), node 0's master port (free, claimed, and
reachable from every node), names and clocks, free space where runs write (the share,
each node's home and temporary directory), and who else uses the nodes (another run,
any user's, or a process on a GPU: refused unless --share-gpus; for a run through Slurm's
queue, only those Slurm does not know of: its own jobs' have other GPUs). At most two SSH
round trips per node.

Also run by `train` before anything is started. Blocking problems raise PreflightError
(after the table is printed); warnings are printed and the job goes on.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import contract, defaults
from ..cluster import ssh
from ..cluster.fanout import each
from ..cluster.inventory import Cluster, NodeSpec
from ..errors import PreflightError
from ..node import fingerprint, health
from ..node.answers import Check, GpuProcess, LiveRun, ReachAnswer
from ..node.space import size
from ..node.util import ago
from .probe import Ahead, NodeFacts, Rendezvous, probe, reach, stop_listener

CLOCK_SKEW_WARN = 2.0  # seconds between the fastest and slowest node clock


@dataclass
class Report:
    cluster: Cluster
    facts: list[NodeFacts]
    clients: dict[str, ssh.Connection] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)   # blocking
    warnings: list[str] = field(default_factory=list)
    master_port: int | None = None
    master_addr: str | None = None   # node 0's cluster address, resolved (an IP)
    backend: str = "gloo"
    nproc_per_node: int | None = None  # None: auto
    drifted: list[str] = field(default_factory=list)  # nodes to provision again
    share_gpus: bool = False   # a node another run or GPU process uses: a warning only
    # train --queue: the GPUs Slurm gave the run on each node ({}: none yet, a dry run);
    # None: a run outside the queue. Slurm shares out a queued run's nodes, so its jobs'
    # runs and processes are no other user (it gave them other GPUs); those started
    # outside Slurm still are.
    queued_gpus: dict[str, list[int]] | None = None
    cordoned_ok: bool = False  # a cordoned node: a warning only (doctor's own run)

    @property
    def queued(self) -> bool:
        return self.queued_gpus is not None

    def nproc(self, facts: NodeFacts) -> int:
        """Processes on a node: the --nproc-per-node given, else one per GPU, or 1 (gloo)."""
        if self.nproc_per_node:
            return self.nproc_per_node
        return facts.gpus if self.backend == "nccl" else 1

    @property
    def fingerprint(self) -> dict | None:
        return self.facts[0].fingerprint if self.facts else None

    def close(self) -> None:
        """End every node's connection, all at once (each asks its master to exit)."""
        each(list(self.clients.values()), lambda c: c.close(), lambda c: c.name)
        self.clients.clear()


def fingerprint_drift(facts: list[NodeFacts]) -> list[str]:
    """Lines naming each package (or runtime) that differs between the nodes' live
    environments, with its version per node (roles/python_env/files/fingerprint.py, the
    comparison playbooks/verify.yml prints too)."""
    return fingerprint.drift({f.node.name: f.fingerprint for f in facts
                                    if f.fingerprint})


def shared_spec(cluster: Cluster) -> dict:
    """The shared path as the inventory describes it: a mount of cluster_shared_path, of
    the types in cluster_shared_fstypes when given, else NFS where the nfs_client role
    mounts it with the kernel (nfs_client_kernel_mount, the default), else any mount (the
    sandbox's stand-in is a bind mount)."""
    v = cluster.variables
    fstypes = v.get("cluster_shared_fstypes")
    if isinstance(fstypes, str):
        fstypes = [fstypes]
    if not fstypes:
        kernel = v.get("nfs_client_kernel_mount")
        kernel = True if kernel is None else str(kernel).lower() not in ("false", "no", "0")
        fstypes = ["nfs", "nfs4"] if kernel else None
    return {"path": cluster.shared_path, "fstypes": list(fstypes) if fstypes else None}


def _check_node(node: NodeSpec, cluster: Cluster, port: int | None, run_id: str | None,
                strict_port: bool = False, rendezvous: Rendezvous | None = None,
                opened: ssh.Connection | None = None, ahead: Ahead | None = None
                ) -> tuple[NodeFacts, ssh.Connection | None]:
    try:
        client = opened if opened is not None and opened.alive() else \
            ssh.connect(node.name, node.ssh)
    except PreflightError as exc:
        return NodeFacts(node, error=str(exc)), None
    if opened is not None and client is not opened:
        opened.close()
    try:
        return probe(node, client, shared=shared_spec(cluster),
                     addresses=[n.cluster_address for n in cluster.nodes], port=port,
                     run_id=run_id, strict_port=strict_port, rendezvous=rendezvous,
                     master_address=cluster.nodes[0].cluster_address,
                     span=cluster.rendezvous_span, admin_group=cluster.admin_group,
                     ahead=ahead), client
    except Exception as exc:  # noqa: BLE001 - reported in the table, job refused
        return NodeFacts(node, error=f"{node.name}: probe failed: {exc}"), client


def run_preflight(cluster: Cluster, port: int | None = None, strict_port: bool = False,
                  keep_connections: bool = False, nproc_per_node: int | None = None,
                  run_id: str | None = None, share_gpus: bool = False,
                  opened: Mapping[str, ssh.Connection] | None = None,
                  cordoned_ok: bool = False,
                  queued_gpus: dict[str, list[int]] | None = None) -> Report:
    """Probe every node in parallel and judge the result (does not raise). With RUN_ID
    (a launch), the master port found on node 0 is claimed for that run. With
    SHARE_GPUS, nodes in use by others are a warning, not a problem. QUEUED_GPUS: the
    GPUs Slurm gave a run through its queue on each node (train --queue), whose nodes are
    Slurm's to share out: only their users outside Slurm count. OPENED: connections made
    already (while the run waited for Slurm), used where they are still alive.

    One round, two where it must: every node is probed at once; node 0 also writes a token
    on the share and listens on the master port, and every other node, its probe done,
    connects to node 0's port and reads the token, which proves the same share and an open
    port. A node that could not (node 0 listens on another port, or not yet) is asked
    again in a second round."""
    port = port or cluster.rendezvous_port
    nodes = cluster.nodes
    rendezvous = Rendezvous.new(len(nodes)) if len(nodes) > 1 else None
    ahead = Ahead(rendezvous, port) if rendezvous is not None else None
    results = list(each(
        nodes, lambda n: _check_node(n, cluster, port if n is nodes[0] else None, run_id,
                                     strict_port, rendezvous if n is nodes[0] else None,
                                     (opened or {}).get(n.name),
                                     None if n is nodes[0] else ahead),
        lambda n: n.name).values_or_raise().values())
    report = Report(cluster, [f for f, _ in results],
                    {f.node.name: c for f, c in results if c is not None},
                    nproc_per_node=nproc_per_node, share_gpus=share_gpus,
                    cordoned_ok=cordoned_ok, queued_gpus=queued_gpus)
    _judge(report, port, strict_port)
    if rendezvous is not None:
        _second_round(report, rendezvous)
    if not keep_connections:
        report.close()
    return report


def _second_round(report: Report, rendezvous: Rendezvous) -> None:
    """Every node but node 0 reads node 0's token and connects to its master port; the
    listener is stopped when not every node got through to it."""
    node0 = report.facts[0]
    listener = node0.listener or {}
    if node0.error or not listener.get("ok"):
        return
    others = [f for f in report.facts[1:]
              if not f.error and f.node.name in report.clients]
    addr = report.master_addr
    if addr:
        # Those that did it at the end of round 1, at node 0's port and address, are done.
        again = [f for f in others if not (f.reach and f.reach.port == listener["port"]
                                           and f.reach.addr == addr)]
        answers = each(again, lambda f: reach(f.node, report.clients[f.node.name], addr=addr,
                                              port=listener["port"], rendezvous=rendezvous,
                                              shared_path=report.cluster.shared_path),
                       lambda f: f.node.name)
        for f in again:  # an error is reported and the job refused
            r = answers[f.node.name]
            f.reach = r.value if r.error is None else ReachAnswer(error=str(r.error))
    reached = sum(_connected(f) for f in others)
    strangers: list[dict[str, str]] = []
    if not (listener.get("self") or {}).get("ok") or reached < len(report.facts) - 1:
        try:
            strangers = stop_listener(node0.node, report.clients[node0.node.name],
                                       listener["port"], rendezvous)
        except (OSError, TimeoutError):
            pass  # it ends by itself (LISTEN_SECONDS and LISTEN_PER_NODE)
    if addr:
        _judge_reach(report, listener["port"], strangers)


def _strangers(report: Report, port: int, strangers: list[dict[str, str]]) -> str | None:
    """Who connected to node 0's listener and could not prove the run's key, in words
    (None: nobody); each named once."""
    seen = {(s.get("addr"), s.get("said")): s for s in strangers}.values()
    if not seen:
        return None
    who = "; ".join(f"from {s.get('addr')}, saying {s.get('said')!r}" for s in seen)
    return (f"someone else connected to {report.facts[0].node.name}'s listener on port "
            f"{port} ({who}) and could not prove the run's key: another user's process?")


def _judge_reach(report: Report, port: int,
                 stopped: list[dict[str, str]] | None = None) -> None:
    """Round 2: the same shared filesystem and node 0's master port, from every node. A
    node that could not connect while strangers were there (who connected to node 0's
    listener without the run's key, as the nodes that got through or the listener's stop,
    STOPPED, tell) is said to have met them, not a firewall."""
    strangers = [s for f in report.facts[1:] if f.reach for s in f.reach.strangers]
    strangers += stopped or []
    met = _strangers(report, port, strangers)
    failed = False
    node0 = report.facts[0]
    n0 = node0.node.name
    path = report.cluster.shared_path
    self_check = (node0.listener or {}).get("self")
    if self_check is not None and not self_check.get("ok"):
        report.problems.append(
            f"{n0} cannot connect to its own master port {port} at {report.master_addr}: "
            f"{self_check.get('error')}; is {report.master_addr} an address of {n0}?")
    for f in report.facts[1:]:
        if f.reach is None:
            continue
        name = f.node.name
        if f.reach.error:
            report.problems.append(f"{name}: could not check the master port and the share "
                                   f"against {n0}: {f.reach.error}")
            continue
        token = f.reach.token or Check(False)
        if node0.shared.get("ok") and f.shared.get("ok") and not token.ok:
            report.problems.append(
                f"{name}: {path} is not the same filesystem as on {n0}: a file {n0} wrote to "
                f"{path}/checkpoints/ is not there ({token.error}); mount the "
                f"cluster's share at {path} on {name}")
        connect = f.reach.connect or Check(False)
        failed = failed or not connect.ok
        if not connect.ok and met:
            first = strangers[0].get("addr")
            report.problems.append(
                f"{name} cannot connect to {n0}'s master port {port} at "
                f"{report.master_addr}: {met} Run again; if it recurs, ask an admin who "
                f"connects to {n0}:{port} from {first}")
        elif not connect.ok:
            report.problems.append(
                f"{name} cannot connect to {n0}'s master port {port} at "
                f"{report.master_addr}: {connect.error}; open TCP port {port} on "
                f"{n0} to the other nodes (the firewall role opens the cluster to itself: "
                f"check for other rules, e.g. `nft list ruleset` on {n0}), or fix "
                f"{n0}'s cluster_address if it is not {n0}'s")
    if met and not failed:
        report.warnings.append(f"{met} It was not counted: the run's own nodes all got "
                               "through")


SHARED_FIX = {
    "missing": "create and mount it (the nfs_client role: {realign})",
    "not_mounted": "mount the share there (the nfs_client role: {realign})",
    "wrong_type": "mount the cluster's share there (the nfs_client role: {realign}), or "
                  "set cluster_shared_fstypes in the inventory to the types you use",
    "empty": "mount the cluster's share there, not an empty directory",
    "no_checkpoints": "mount the cluster's share there (its nfs_server role makes "
                      "checkpoints/), or create <share>/checkpoints with mode 1777",
    "not_writable": "the job's user must be able to write there with the same uid on every "
                    "node: fix the owner or mode of that directory on the share",
}


def _env_create_command(report: Report, name: str) -> str:
    """What makes (or puts back) a user's own environment NAME on the nodes."""
    inventory = report.cluster.inventory or defaults.INVENTORY
    return (f"python -m orchestrator env create -f ENVIRONMENT_FILE --name {name} "
            f"-i {inventory} (the file it was made from; a changed file makes a new one)")


def _realign_command(report: Report, nodes: list[str]) -> str:
    command: str = fingerprint.realign_command(report.cluster.inventory or defaults.INVENTORY,
                                                     nodes)
    return command


def _judge(report: Report, port: int, strict_port: bool) -> None:
    p, w = report.problems, report.warnings
    for f in report.facts:
        name = f.node.name
        if f.error:
            p.append(f.error if f.error.startswith(name) else f"{name}: {f.error}")
            continue
        own = f.node.python_env
        if f.python_env_error and own:
            p.append(f"{name}: {f.user}'s environment {own} is not there "
                     f"({f.python_env_error}); make it on the nodes: "
                     f"{_env_create_command(report, own)}")
        elif f.python_env_error:
            p.append(f"{name}: {f.python_env_error}; provision the node "
                     f"({_realign_command(report, [name])}) so that the python_env role "
                     "writes it")
        elif f.fingerprint_error:
            p.append(f"{name}: {f.fingerprint_error}; "
                     + (f"make {f.user}'s environment {own} again: "
                        f"{_env_create_command(report, own)}" if own else
                        f"provision the node again ({_realign_command(report, [name])})"))
        elif f.torch.get("skipped"):
            pass  # drift, reported below
        elif not f.torch.get("ok"):
            p.append(f"{name}: torch is not importable with {(f.python_env or {}).get('python')}: "
                     f"{f.torch.get('error')}; provision the node again "
                     f"({_realign_command(report, [name])})")
        else:
            _judge_gpus(report, f)
            if not f.torch.get("torchrun"):
                p.append(f"{name}: torchrun {(f.python_env or {}).get('torchrun')} "
                         "is not executable")
        _judge_busy(report, f)
        _judge_cordon(report, f)
        if f.provisioned_error and not f.python_env_error:
            w.append(f"{name}: {f.provisioned_error}; the environment cannot be compared with "
                     "the one provisioned (only between nodes)")
        if not f.shared.get("ok") and f.shared.get("kind") != "full":   # _judge_full
            kind: str = f.shared.get("kind", "")
            fix = SHARED_FIX.get(kind, "check the nfs_client mount (cluster_shared_path)")
            p.append(f"{name}: shared path: {f.shared.get('error')}; "
                     + (f.shared.get("fix")   # the node's own words: not_own, open
                        or fix.format(realign=_realign_command(report, [name]))))
        unresolved = [n for n, addr in f.resolve.items() if addr is None
                      and n != report.cluster.nodes[0].cluster_address]
        if unresolved:
            w.append(f"{name}: cannot resolve {', '.join(unresolved)} (torchrun uses IP "
                     "addresses, but scripts that use host names will fail)")
    _judge_space(report)
    _judge_full(report)
    _judge_drift(report)
    offsets = [f.clock_offset for f in report.facts if f.clock_offset is not None]
    if len(offsets) > 1 and max(offsets) - min(offsets) > CLOCK_SKEW_WARN:
        w.append(f"clocks differ by {max(offsets) - min(offsets):.1f} s between nodes; "
                 "timestamps in logs will not line up (enable NTP/chrony)")
    _judge_addresses(report)
    _judge_machines(report)
    _judge_port(report, port, strict_port)
    gpus = [f.gpus for f in report.facts if not f.error]
    report.backend = "nccl" if gpus and all(g > 0 for g in gpus) else "gloo"


WHAT_GROWS = {"share": "checkpoints, datasets, the runs' snapshots",
              "home": "environments under ~/.clustertrain, caches",
              "tmp": "temporary files"}


def _whose(users: dict[str, Any] | None, shown: int = 3) -> str:
    """Who fills the share, as its server counted it while it was nearly full (node/health.py
    read_users): its SHOWN biggest users and when they were counted."""
    counted = users or {}
    biggest = sorted(((n, b) for n, b in (counted.get("users") or {}).items() if b > 0),
                     key=lambda u: -u[1])[:shown]
    if not biggest:
        return "; `clustertrain du` shows whose"
    return (f"; its biggest users {ago(float(counted.get('time') or 0))}: "
            + ", ".join(f"{n} {size(b)}" for n, b in biggest) + "; `clustertrain du` shows what")


def _judge_space(report: Report) -> None:
    """Too little free space or too few inodes where runs write: refused below the
    cluster's minimum, a warning below SPACE_WARN. The share once (every node sees the
    same; with its biggest users when its server counted them), a node's home and
    temporary directory per node."""
    need = report.cluster.min_free_gb
    seen_share = False
    for f in report.facts:
        for place in f.space:
            if place["what"] == "share":
                if seen_share:
                    continue
                seen_share = True
                where = f"the share {place['path']}"
            else:
                where = f"{f.node.name}: {place['path']}"
            if place.get("error"):
                report.warnings.append(f"{where}: free space unknown ({place['error']})")
                continue
            free, total = place["free"], place["total"]
            ifree, itotal = place["ifree"], place["itotal"]
            grows = WHAT_GROWS.get(place["what"], "files") + (
                _whose(f.share_users) if place["what"] == "share" else "")
            gib = f"{size(free)} free of {size(total)}"
            if free < need * 2**30:
                report.problems.append(
                    f"{where} has {gib}, below the {need:g} GiB a run needs there "
                    f"(cluster_min_free_gb): free some ({grows}) or lower "
                    "cluster_min_free_gb in the inventory")
            elif itotal and ifree < defaults.MIN_FREE_INODES:
                report.problems.append(
                    f"{where} has {ifree} inodes free of {itotal}, below "
                    f"{defaults.MIN_FREE_INODES}: remove files there ({grows})")
            elif total and free < defaults.SPACE_WARN * total:
                report.warnings.append(f"{where} is nearly full: {gib} ({grows})")
            elif itotal and ifree < defaults.SPACE_WARN * itotal:
                report.warnings.append(f"{where} is nearly out of inodes: {ifree} free "
                                       f"of {itotal} ({grows})")
    for f in report.facts:   # its health check's word on who fills its own disk
        report.warnings += [f"{f.node.name}: {said}" for said in f.health_warnings]




def _judge_full(report: Report) -> None:
    """Nodes that could not write to the share because it, or the user's quota, is full:
    one problem, unless the share's free space (_judge_space) refused the run already."""
    full = [f for f in report.facts if not f.error and f.shared.get("kind") == "full"]
    path = report.cluster.shared_path
    if full and not any(p.startswith(f"the share {path} ") for p in report.problems):
        report.problems.append(
            f"{', '.join(f.node.name for f in full)}: shared path: {full[0].shared['error']}; "
            f"free some of {full[0].user}'s files there (`clustertrain du` shows what), or "
            "ask an admin for more room (a quota, a bigger share)")


def _judge_port(report: Report, port: int, strict_port: bool) -> None:
    """Node 0's master port: PORT free and claimed, or the one found instead."""
    p, w = report.problems, report.warnings
    node0 = report.facts[0]
    if not node0.error and port < 1024 and node0.uid != 0:
        p.append(f"{node0.node.name}: master port {port} is privileged (below 1024) and the "
                 f"job runs as {node0.user}, who may not listen on it; choose a port in "
                 "1024-65535 (--master-port or cluster_rendezvous_port)")
    elif not node0.error:
        listener = node0.listener or {}
        if node0.port_warning:
            w.append(f"{node0.node.name}: {node0.port_warning}")
        if node0.port_error:
            p.append(f"{node0.node.name}: cannot check the master port: {node0.port_error}")
        elif node0.port_free:
            report.master_port = port
        elif strict_port:
            p.append(f"{node0.node.name}: master port {port} is in use; choose another "
                     "with --master-port")
        elif node0.free_port:
            report.master_port = node0.free_port
            w.append(f"{node0.node.name}: master port {port} is in use; using "
                     f"{node0.free_port} instead")
        else:
            p.append(f"{node0.node.name}: no free port in {port}-"
                     f"{port + report.cluster.rendezvous_span - 1}")
        if listener.get("error") and report.master_port:
            p.append(f"{node0.node.name}: master port {report.master_port}: "
                     f"{listener['error']} (taken a moment ago?); run again")


def _judge_drift(report: Report) -> None:
    """The live environments: equal on every node, and as provisioned (the lines and the
    nodes to re-align come from fingerprint.py, as in playbooks/verify.yml)."""
    have = [f for f in report.facts if f.fingerprint]
    found = fingerprint.report({f.node.name: f.fingerprint for f in have},
                                     {f.node.name: f.provisioned for f in have})
    if not found["lines"]:
        return
    report.drifted = found["realign"]
    own = report.cluster.nodes[0].python_env
    if own:   # a user's own environment: env create puts it back, not site.yml
        user = report.facts[0].user
        report.problems.append(
            f"environment drift in {user}'s environment {own} (read from each node's "
            "environment now):\n    " + "\n    ".join(found["lines"])
            + f"\n  put it back on {', '.join(found['realign'])}: "
            + _env_create_command(report, own))
        return
    report.problems.append(fingerprint.message(
        found, report.cluster.inventory or defaults.INVENTORY))


def _judge_gpus(report: Report, f: NodeFacts) -> None:
    """GPUs the driver shows (counted without torch) against what torch saw."""
    name, torch = f.node.name, f.torch
    if not f.gpu_count:
        return
    how = f" ({f.gpu_source})" if f.gpu_source else ""
    if not torch.get("cuda_available"):
        report.problems.append(
            f"{name}: {f.gpu_count} GPUs{how}, but torch {torch.get('version')} cannot use "
            "CUDA (a CPU build of torch, or the driver does not work: nvidia-smi)")
    elif int(torch.get("gpus") or 0) < f.gpu_count:
        report.problems.append(f"{name}: torch sees {torch.get('gpus')} of the "
                               f"{f.gpu_count} GPUs{how}; check nvidia-smi and "
                               "CUDA_VISIBLE_DEVICES")


def _judge_cordon(report: Report, f: NodeFacts) -> None:
    """A node in the share's cordon record (a run lost it, doctor named it, its health check
    failed) is kept out; so is one whose health check fails, which may not have reached the
    record (its share stalls)."""
    held = f.cordon or _health_cordon(f.health)
    if not held:
        return
    name = f.node.name
    why = held.get("why") or "no reason given"
    said = f"{name}: cordoned since {held.get('since')} by {held.get('by')}: {why}"
    if report.cordoned_ok:
        report.warnings.append(said)
    elif why.startswith(health.WHY) or f.health:
        report.problems.append(
            f"{said}; leave it out (--hosts): it returns by itself once its health check "
            f"passes (`sudo systemctl start {health.UNIT}` on it checks now)")
    else:
        report.problems.append(
            f"{said}; leave it out (--hosts), or once it is fixed return it with "
            f"`python -m orchestrator uncordon {name}` (or run `doctor` on it: a clean "
            "doctor returns it)")


def _health_cordon(verdict: dict[str, Any] | None) -> dict[str, Any] | None:
    """A failing health verdict of the node's own disk, said as a cordon."""
    if not verdict:
        return None
    since = verdict.get("since")
    when = health.cordon.iso(since) if isinstance(since, (int, float)) else "now"
    failing = "; ".join(str(x.get("why")) for x in verdict.get("failing") or [])
    return {"since": when, "by": "its health check", "why": health.WHY + failing}


def _judge_busy(report: Report, f: NodeFacts) -> None:
    """Another run on the node (any user's, this user's other runs too), or a process of
    no run on its GPUs: refused, naming them, unless --share-gpus (then a warning). A
    queued run's node is Slurm's to share out: its Slurm jobs' runs and processes (the
    run's own job's too) hold other GPUs than the run's and are not counted; the others,
    started outside Slurm, hold GPUs Slurm counts free, and are."""
    if f.busy is None:
        return
    name, busy = f.node.name, f.busy
    if busy.error:
        report.warnings.append(f"{name}: cannot tell whether its GPUs are in use: "
                               f"{busy.error}")
    if busy.hidden:
        report.warnings.append(f"{name}: other users' processes are hidden from {f.user} "
                               "(/proc is mounted with hidepid): their runs there cannot be "
                               "seen")
    runs, bare = busy.runs, busy.gpu_processes
    if report.queued_gpus is not None:
        runs, bare = _outside_slurm(report, name, runs, bare,
                                    report.queued_gpus.get(name) or [])
    users = [f"{r.user}'s {r.kind} {r.run}" + _on_gpus(r.gpus) + _in_job(r.slurm_job)
             for r in runs]
    users += _gpu_processes(bare)
    if not users:
        return
    them = "them" if len(users) > 1 else "it"
    what = f"{name} is in use by " + "; ".join(users) + (
        ", started outside Slurm (without --queue)" if report.queued else "")
    if report.share_gpus:
        report.warnings.append(f"{what}; running beside {them} (--share-gpus)")
    else:
        report.problems.append(f"{what}" + _busy_fix(report.queued, them))


def _outside_slurm(report: Report, name: str, runs: list[LiveRun], bare: list[GpuProcess],
                   given: list[int]) -> tuple[list[LiveRun], list[GpuProcess]]:
    """Of node NAME's runs and bare GPU processes, those a queued run counts: not of a
    Slurm job. A process whose ancestry cannot be seen (another user's under hidepid,
    another container's) counts when it holds a GPU Slurm GIVEN the run (no job of
    Slurm's holds that one); on others, whether Slurm knows of it is only warned about."""
    unseen = [g for g in bare if g.slurm_job is None and g.user is None]
    clash = {g.pid for g in unseen if g.gpu in given}
    left = [g for g in unseen if g.pid not in clash]
    if left:
        pids = {g.pid for g in left}
        report.warnings.append(
            f"{name}: " + "; ".join(_gpu_processes(left)) + ": whether Slurm knows of "
            f"{'them' if len(pids) > 1 else 'it'} cannot be told from here (not on this "
            "run's GPUs)")
    else:
        pids = set()
    return ([r for r in runs if r.slurm_job is None],
            [g for g in bare if g.slurm_job is None and g.pid not in pids])


def _busy_fix(queued: bool, them: str) -> str:
    """What a run refused for a busy node may do; a queued one was put there by Slurm,
    which counts the GPUs of runs started outside it free."""
    stop = (f"Wait for {them} to end or have {them} stopped (`python -m orchestrator runs` "
            "lists a user's runs, `python -m orchestrator stop RUN` stops one)")
    if queued:
        return (f": Slurm counts those GPUs free and gave this run the node beside {them}. "
                f"{stop} and run again, ask for other nodes (--hosts), or pass "
                f"--share-gpus to run beside {them}")
    return f". {stop}, or pass --share-gpus to run beside {them}"


def _in_job(job: str | None) -> str:
    """' (Slurm job 42)' / '' (started outside Slurm)."""
    return f" (Slurm job {job})" if job else ""


def _gpu_processes(rows: list[GpuProcess]) -> list[str]:
    """Each process once (nvidia-smi gives a row per process and GPU): 'PID 4242 of carol
    (python eval.py) on GPUs 2, 3, 2560 MiB'."""
    by_pid: dict[int, list[GpuProcess]] = {}
    for g in rows:
        by_pid.setdefault(g.pid, []).append(g)
    said = []
    for pid, mine in by_pid.items():
        g, used = mine[0], [m.used_mib for m in mine if m.used_mib is not None]
        said.append(f"PID {pid} of {g.user or 'a user not visible here'}"
                    + (f" ({g.command})" if g.command else "")
                    + _on_gpus([m.gpu if m.gpu is not None else m.uuid for m in mine])
                    + (f", {sum(used)} MiB" if used else "") + _in_job(g.slurm_job))
    return said


def _on_gpus(gpus: list[int] | list[int | str]) -> str:
    """' on GPU 0' / ' on GPUs 0, 1' / '' (a run on CPUs)."""
    if not gpus:
        return ""
    return f" on GPU{'s' if len(gpus) > 1 else ''} {', '.join(str(g) for g in gpus)}"


def _judge_addresses(report: Report) -> None:
    """Node 0's cluster address, resolved on every node, is the master address: every
    node must resolve it, to the same IP; no two nodes may resolve to one machine."""
    nodes = report.cluster.nodes
    up = [f for f in report.facts if not f.error]
    if not up or report.facts[0].error:
        return
    master = nodes[0].cluster_address
    seen = {f.node.name: f.resolve.get(master) for f in up}
    missing = [n for n, ip in seen.items() if ip is None]
    if missing:
        report.problems.append(
            f"{', '.join(missing)} cannot resolve {nodes[0].name}'s cluster_address "
            f"{master!r}, the master address; fix the name (DNS, /etc/hosts) or set "
            f"cluster_address of {nodes[0].name} to an address every node resolves")
        return
    if len(set(seen.values())) > 1:
        report.problems.append(
            f"{nodes[0].name}'s cluster_address {master!r} resolves to different addresses "
            "on the nodes (" + ", ".join(f"{n}={ip}" for n, ip in seen.items()) + "); "
            "fix DNS so that every node sees the same address, or set an IP")
        return
    report.master_addr = next(iter(seen.values()))
    resolved = report.facts[0].resolve
    by_ip: dict[str, str] = {}
    for node in nodes:
        ip = resolved.get(node.cluster_address)
        if ip is None:
            continue
        other = by_ip.setdefault(ip, node.name)
        if other != node.name:
            report.problems.append(
                f"{other} and {node.name} both resolve to {ip} (cluster_address "
                f"{node.cluster_address!r}); each training node must be "
                "a different machine: fix cluster_address or DNS")


def _judge_machines(report: Report) -> None:
    """Each training node must be a machine of its own: two inventory hosts that reached
    the same machine (an ansible_host copied from another node, say) would share its job
    directory and run one node's part twice."""
    seen: dict[tuple[str, ...], str] = {}
    for f in report.facts:
        m = f.machine
        if f.error or not m:
            continue
        key = (m.get("hostname", ""), m.get("machine_id", ""), m.get("boot_id", ""),
               m.get("host_keys", ""))
        other = seen.setdefault(key, f.node.name)
        if other != f.node.name:
            report.problems.append(
                f"{other} and {f.node.name} are the same machine (host name {key[0]}, "
                f"machine id {key[1][:12] or '-'}, boot id {key[2][:8] or '-'}, the same SSH "
                f"host keys): the inventory reaches it as {other} "
                f"({report.cluster.node(other).ssh.display}) and as {f.node.name} "
                f"({f.node.ssh.display}); fix ansible_host (or the Host entry in your SSH "
                "config) of the one that is wrong")


def _address(f: NodeFacts) -> str:
    """The cluster address as the inventory gives it, with its IP when it is a name."""
    addr = f.node.cluster_address
    ip = f.resolve.get(addr)
    if contract.is_ip(addr):
        return addr
    return f"{addr}[{ip}]" if ip else addr


def render_table(report: Report) -> str:
    head = ("NODE", "ADDRESS", "USER", "SSH", "TORCH", "GPUS", "NPROC", "FINGERPRINT",
            "SHARED", "PORT", "CLOCK")
    rows = [head]
    drift = set(report.drifted)
    for i, f in enumerate(report.facts):
        if f.error:
            rows.append((f.node.name, f.node.cluster_address, f.node.user or "-", "FAIL",
                         "-", "-", "-", "-", "-", "-", "-"))
            continue
        fp = str((f.fingerprint or {}).get("sha256") or "unreadable")[:12]
        rows.append((
            f.node.name, _address(f), f.user or "-", "ok",
            f.torch.get("version") or ("-" if f.torch.get("skipped") else "FAIL"),
            str(f.gpus), str(report.nproc(f)),
            fp + (" DRIFT" if f.node.name in drift else ""),
            "ok" if f.shared.get("ok") else "FAIL",
            (str(report.master_port) if report.master_port else "taken") if i == 0 else
            _reached(f),
            f"{f.clock_offset:+.2f}s" if f.clock_offset is not None else "-",
        ))
    widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
    return "\n".join("  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row)).rstrip()
                     for row in rows)


def _reached(f: NodeFacts) -> str:
    """Whether this node reached node 0's master port (round 2)."""
    if not f.reach:
        return "-"
    return "ok" if _connected(f) else "FAIL"


def _connected(f: NodeFacts) -> bool:
    """Whether this node connected to node 0's listener (round 2)."""
    return bool(f.reach and f.reach.connect and f.reach.connect.ok)


def print_report(report: Report, out=None, comment: bool = False) -> None:
    """The table, warnings and problems; with COMMENT, each line as a YAML comment (a
    dry run's output is a job file)."""
    out = out or sys.stdout
    lead = "# " if comment else ""
    for line in render_table(report).splitlines():
        print(f"{lead}{line}", file=out)
    for line in report.warnings:
        print(f"{lead}warning: {line}", file=out)
    for line in report.problems:
        print(f"{lead}problem: {line}", file=out)


def raise_if_blocked(report: Report) -> None:
    if report.problems:
        raise PreflightError(
            f"preflight found {len(report.problems)} blocking problem(s); nothing was "
            "started:\n  " + "\n  ".join(report.problems))


