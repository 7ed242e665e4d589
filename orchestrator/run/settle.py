"""A run's record, settled from what the nodes wrote on the shared filesystem.

A run whose controller went away (detached, killed, a closed laptop) has no
summary.json yet; the nodes' supervisors kept its state (node/supervise.py: one JSON file per
node, a heartbeat while running, the exit status and why at the end). `settle` reads it
through any node that answers and, once the run is over, writes the summary, so no
record says "running" for a run that is gone.
"""

from __future__ import annotations

import json
from typing import Any

from ..cluster import nodelib, ssh
from ..cluster.inventory import load_cluster
from ..diagnosis.diagnose import read_node_dumps
from .record import RunDir
from .status import summarize

# Who found a detached run hung, in its summary.
DETACHED = "the nodes (detached run)"


def fetch_states(info: dict[str, Any]) -> tuple[dict[str, dict], float, dict[str, dict]]:
    """The nodes' state files, the time on the node that answered, and the nodes' hang
    dumps, read through the first node that answers."""
    cluster = load_cluster(info["inventory"]).select(hosts=",".join(info["nodes"]))
    commands = info.get("node_commands") or {}
    errors = []
    for spec in cluster.nodes:
        state_dir = (commands.get(spec.name) or {}).get("run_state")
        if not state_dir:
            continue
        try:
            conn = ssh.connect(spec.name, spec.ssh)
        except Exception as exc:  # noqa: BLE001 - try the next node
            errors.append(str(exc))
            continue
        try:
            result = nodelib.call(conn, spec.python, "states", state_dir, timeout=30)
        finally:
            conn.close()
        if result.exit_code == 0 and result.stdout.strip():
            data = json.loads(result.stdout.strip().splitlines()[-1])
            return data["states"], float(data["now"]), data.get("hang") or {}
        errors.append(f"{spec.name}: {result.stderr.strip()[-200:]}")
    raise OSError("no node of the run answered: " + "; ".join(errors))


def settle(run: RunDir) -> dict | None:
    """The run's summary: the one on disk, else one settled from the nodes and written
    (None while the run is still running)."""
    summary = run.summary()
    if summary is not None:
        return summary
    info = run.info()
    if info.get("queued"):   # still waiting in Slurm's queue, or its train is gone
        from .allocation import settle_queued
        return settle_queued(run, info)
    states, now, dumps = fetch_states(info)
    summary = summarize(info, states, now, run)
    if summary is not None:
        if dumps:  # the nodes found the run hung (detached): read their dumps here
            summary["hang"] = read_hang_dumps(dumps, run)
        run.write_summary(summary)
    return summary


def read_hang_dumps(dumps: dict[str, dict], run: RunDir) -> dict[str, Any]:
    """The hang dumps the nodes of a detached run left on the share, read into the run's
    record (runs/<run>/hang/), as the controller of an attached run reads them."""
    return read_node_dumps(dumps, run.path / "hang", DETACHED)
