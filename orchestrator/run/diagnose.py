"""`diagnose RUN`: a running run's nodes, from its record, sampled at once and read
(diagnosis/dumps.py samples and reads; this is the run's side: its record, its owner,
its nodes' connections and each node's torchrun)."""

from __future__ import annotations

import time
from pathlib import Path

from ..cluster import ssh
from ..cluster.inventory import load_cluster
from ..diagnosis.dumps import Diagnosis, analyse, sample, targets_of
from ..errors import ClusterError
from ..record.rundir import check_owner, open_run
from .command import NodeCommand


def diagnose_run(runs_dir: Path, run_id: str, native: bool = False) -> Diagnosis:
    """`diagnose RUN`: sample every rank of a running run, keep the dumps in the run's
    record (diagnose/<time>/) and name the suspects."""
    run = open_run(runs_dir, run_id)
    info = run.info()
    if not info.get("node_commands"):
        raise ClusterError(f"run {run_id} was started by an older version; it cannot be "
                           "diagnosed")
    summary = run.summary()
    if summary is not None:
        raise ClusterError(f"run {run_id} has ended ({summary.status}): there is "
                           f"nothing to dump; see `python -m orchestrator logs {run_id}`")
    cluster = load_cluster(info["inventory"]).select(hosts=",".join(info["nodes"]))
    check_owner(cluster.nodes, info, "read its processes")
    clients = ssh.connect_all(list(cluster.nodes))
    try:
        commands = info["node_commands"]
        nodes = [(spec, NodeCommand.from_record(commands[spec.name]).torchrun)
                 for spec in cluster.nodes]
        rounds = sample(targets_of(nodes, clients), run_id, native=native)
    finally:
        for conn in clients.values():
            conn.close()
    return analyse(rounds, run.path / "diagnose" / time.strftime("%Y%m%d-%H%M%S"))
