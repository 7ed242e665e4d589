"""`preflight`: are the chosen nodes ready to run a job together? One row per node.

Also run by `train` before anything is started. Blocking problems raise PreflightError
(after the table is printed); warnings are printed and the job goes on.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
import ipaddress
from dataclasses import dataclass, field

from . import ssh
from .errors import PreflightError
from .inventory import Cluster, DEFAULT_INVENTORY, NodeSpec, load_cluster
from .probe import NodeFacts, probe

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

    def nproc(self, facts: NodeFacts) -> int:
        """Processes on a node: the --nproc-per-node given, else one per GPU, or 1 (gloo)."""
        if self.nproc_per_node:
            return self.nproc_per_node
        return facts.gpus if self.backend == "nccl" else 1

    @property
    def fingerprint(self) -> dict | None:
        return self.facts[0].fingerprint if self.facts else None

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()


def fingerprint_drift(facts: list[NodeFacts]) -> list[str]:
    """Lines naming each package (or runtime) that differs, with its version per node."""
    have = [f for f in facts if f.fingerprint]
    if len(have) < 2:
        return []
    lines = []
    packages = sorted({p for f in have for p in (f.fingerprint.get("packages") or {})})
    for pkg in packages:
        versions = {f.node.name: (f.fingerprint.get("packages") or {}).get(pkg) for f in have}
        if len(set(versions.values())) > 1:
            lines.append(f"package {pkg}: " + ", ".join(
                f"{node}={ver or 'absent'}" for node, ver in versions.items()))
    for key in ("python", "torch", "cuda", "nccl", "driver"):
        values = {f.node.name: f.fingerprint.get(key) for f in have}
        if len(set(map(str, values.values()))) > 1:
            lines.append(f"{key}: " + ", ".join(f"{n}={v}" for n, v in values.items()))
    if not lines and len({f.fingerprint.get("sha256") for f in have}) > 1:
        lines.append("sha256 differs: " + ", ".join(
            f"{f.node.name}={str(f.fingerprint.get('sha256'))[:12]}" for f in have))
    return lines


def _check_node(node: NodeSpec, cluster: Cluster, port: int | None, run_id: str | None
                ) -> tuple[NodeFacts, ssh.Connection | None]:
    try:
        client = ssh.connect(node.name, node.ssh)
    except PreflightError as exc:
        return NodeFacts(node, error=str(exc)), None
    try:
        return probe(node, client, shared_path=cluster.shared_path,
                     addresses=[n.cluster_address for n in cluster.nodes], port=port,
                     run_id=run_id), client
    except Exception as exc:  # noqa: BLE001 - reported in the table, job refused
        return NodeFacts(node, error=f"{node.name}: probe failed: {exc}"), client


def run_preflight(cluster: Cluster, port: int | None = None, strict_port: bool = False,
                  keep_connections: bool = False, nproc_per_node: int | None = None,
                  run_id: str | None = None) -> Report:
    """Probe every node in parallel and judge the result (does not raise). With RUN_ID
    (a launch), the master port found on node 0 is claimed for that run."""
    port = port or cluster.rendezvous_port
    with ThreadPoolExecutor(max_workers=min(len(cluster.nodes), 32)) as pool:
        results = list(pool.map(
            lambda n: _check_node(n, cluster, port if n is cluster.nodes[0] else None,
                                  run_id), cluster.nodes))
    report = Report(cluster, [f for f, _ in results],
                    {f.node.name: c for f, c in results if c is not None},
                    nproc_per_node=nproc_per_node)
    _judge(report, port, strict_port)
    if not keep_connections:
        report.close()
    return report


def _judge(report: Report, port: int, strict_port: bool) -> None:
    p, w = report.problems, report.warnings
    for f in report.facts:
        name = f.node.name
        if f.error:
            p.append(f.error if f.error.startswith(name) else f"{name}: {f.error}")
            continue
        if f.python_env_error:
            p.append(f"{name}: {f.python_env_error}; provision the node "
                     "(python -m orchestrator provision) so that the python_env role writes it")
        elif not f.torch.get("ok"):
            p.append(f"{name}: torch is not importable with {f.python_env.get('python')}: "
                     f"{f.torch.get('error')}; re-run provisioning (python_env role)")
        elif not f.torch.get("torchrun"):
            p.append(f"{name}: torchrun {f.python_env.get('torchrun')} is not executable")
        if f.fingerprint_error:
            p.append(f"{name}: {f.fingerprint_error}; provision the node so that the "
                     "environments can be compared")
        if not f.shared.get("ok"):
            p.append(f"{name}: shared path not readable ({f.shared.get('error')}); check the "
                     "nfs_client mount (cluster_shared_path)")
        unresolved = [n for n, addr in f.resolve.items() if addr is None
                      and n != report.cluster.nodes[0].cluster_address]
        if unresolved:
            w.append(f"{name}: cannot resolve {', '.join(unresolved)} (torchrun uses IP "
                     "addresses, but scripts that use host names will fail)")
    drift = fingerprint_drift(report.facts)
    if drift:
        p.append("environment drift between nodes (fingerprint.json differs):\n    "
                 + "\n    ".join(drift)
                 + "\n  re-run provisioning on all nodes so that they install the same versions")
    offsets = [f.clock_offset for f in report.facts if f.clock_offset is not None]
    if len(offsets) > 1 and max(offsets) - min(offsets) > CLOCK_SKEW_WARN:
        w.append(f"clocks differ by {max(offsets) - min(offsets):.1f} s between nodes; "
                 "timestamps in logs will not line up (enable NTP/chrony)")
    _judge_addresses(report)
    node0 = report.facts[0]
    if not node0.error and port < 1024 and node0.uid != 0:
        p.append(f"{node0.node.name}: master port {port} is privileged (below 1024) and the "
                 f"job runs as {node0.user}, who may not listen on it; choose a port in "
                 "1024-65535 (--master-port or cluster_rendezvous_port)")
    elif not node0.error:
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
            p.append(f"{node0.node.name}: no free port in {port}-{port + 199}")
    gpus = [f.gpus for f in report.facts if not f.error]
    report.backend = "nccl" if gpus and all(g > 0 for g in gpus) else "gloo"


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


def _address(f: NodeFacts) -> str:
    """The cluster address as the inventory gives it, with its IP when it is a name."""
    addr = f.node.cluster_address
    ip = f.resolve.get(addr)
    try:
        ipaddress.ip_address(addr)
        return addr
    except ValueError:
        return f"{addr}[{ip}]" if ip else addr


def render_table(report: Report) -> str:
    head = ("NODE", "ADDRESS", "USER", "SSH", "TORCH", "GPUS", "NPROC", "FINGERPRINT",
            "SHARED", "PORT", "CLOCK")
    rows = [head]
    drift = bool(fingerprint_drift(report.facts))
    for i, f in enumerate(report.facts):
        if f.error:
            rows.append((f.node.name, f.node.cluster_address, f.node.user or "-", "FAIL",
                         "-", "-", "-", "-", "-", "-", "-"))
            continue
        fp = str((f.fingerprint or {}).get("sha256") or "missing")[:12]
        rows.append((
            f.node.name, _address(f), f.user or "-", "ok",
            f.torch.get("version") or "FAIL",
            str(f.gpus), str(report.nproc(f)),
            fp + (" DRIFT" if drift else ""),
            "ok" if f.shared.get("ok") else "FAIL",
            (str(report.master_port) if report.master_port else "taken") if i == 0 else "-",
            f"{f.clock_offset:+.2f}s" if f.clock_offset is not None else "-",
        ))
    widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
    return "\n".join("  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row)).rstrip()
                     for row in rows)


def print_report(report: Report, out=None) -> None:
    out = out or sys.stdout
    print(render_table(report), file=out)
    for line in report.warnings:
        print(f"warning: {line}", file=out)
    for line in report.problems:
        print(f"problem: {line}", file=out)


def raise_if_blocked(report: Report) -> None:
    if report.problems:
        raise PreflightError(
            f"preflight found {len(report.problems)} blocking problem(s); nothing was "
            "started:\n  " + "\n  ".join(report.problems))


def add_selection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--inventory", default=str(DEFAULT_INVENTORY),
                   help="Ansible inventory, the one site.yml uses (default: %(default)s)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--nodes", type=int, help="use the first N nodes of train_nodes")
    group.add_argument("--hosts", help="use these nodes, by inventory name: a,b")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preflight", help="check that the nodes are ready to train together",
                       description="SSH, identical environments, torch, GPUs, shared path, "
                       "master port, name resolution and clocks, on every node at once.")
    add_selection_args(p)
    p.add_argument("--master-port", type=int, help="port to check on node 0 "
                   "(default: cluster_rendezvous_port, else 29500)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    cluster = load_cluster(args.inventory).select(args.nodes, args.hosts)
    report = run_preflight(cluster, args.master_port)
    print_report(report)
    return 1 if report.problems else 0
