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
from ..diagnosis.diagnose import NodeDumps, analyse
from ..node.protocol import PEER_TIMEOUT, End
from .record import RunDir, RunStatus, iso


def summarize(info: dict[str, Any], states: dict[str, dict], now: float) -> dict | None:
    """The run's summary from its nodes' states, or None while it still runs. A node
    whose heartbeat stopped (older than PEER_TIMEOUT by the node's clock) is lost."""
    nodes = info["nodes"]
    ended = {n: s for n, s in states.items() if s.get("state") == "ended"}
    reasons = {n: _reason(s) for n, s in ended.items()}
    # Lost: named lost by a peer that stopped because of it, or silent for too long.
    blamed = [s.get("why") for n, s in ended.items() if reasons[n] == End.PEER_LOST]
    lost = [n for n in nodes if n not in ended and (
        n in blamed or n not in states
        or now - float(states[n].get("time", 0)) > 2 * PEER_TIMEOUT)]
    if len(ended) + len(lost) < len(nodes):
        return None
    # The first to go wrong, by when: a failed node by its end, a lost one by its last
    # heartbeat (its peers' ranks fail after it, when their collectives break).
    failed = sorted([(float(s.get("ended", 0)), n) for n, s in ended.items()
                     if not reasons[n].caused_elsewhere and s.get("code") != 0]
                    + [(float(states.get(n, {}).get("time", 0)), n) for n in lost])
    how = set(reasons.values())
    status: RunStatus
    first: str | None
    if End.HUNG in how:  # the nodes stopped it for a hang: what failed then followed
        status, first = RunStatus.HUNG, None
    elif failed:
        status, first = RunStatus.FAILED, failed[0][1]
    elif blamed:
        status, first = RunStatus.FAILED, blamed[0]
    elif End.CONTROLLER_LOST in how:
        status, first = RunStatus.CONTROLLER_LOST, None
    elif how & {End.STOPPED, End.PEER_STOPPED}:
        status, first = RunStatus.STOPPED, None
    else:
        status, first = RunStatus.SUCCEEDED, None
    start = min((float(s.get("started", now)) for s in states.values()), default=now)
    end = max((float(s.get("ended", now)) for s in ended.values()), default=now)
    return {
        **info,
        "status": status,
        "start": iso(start), "end": iso(end), "duration_s": round(end - start, 3),
        "nodes": [_node_record(n, ended.get(n)) for n in nodes],
        "exit_codes": {n: ended.get(n, {}).get("code") for n in nodes},
        "first_failed": first,
        "settled_from": "the nodes' state on the shared filesystem",
    }


def _reason(state: dict) -> End:
    """How a node's part ended, from its state file (one the supervisor wrote)."""
    try:
        return End(state.get("reason", End.EXITED.value))
    except ValueError:
        return End.LOST  # not a state this version wrote: say nothing more of it


def _node_record(name: str, state: dict | None) -> dict:
    """As train records a node: end_reason exited, stopped (the cause in `why` when it
    was another node's failure or loss, or the controller's) or lost."""
    if state is None:
        return {"name": name, "exit_code": None, "end_reason": End.LOST.value}
    reason, why = _reason(state), state.get("why") or ""
    if reason.caused_elsewhere and reason != End.STOPPED:
        reason, why = End.STOPPED, f"{reason} {why}".strip()
    return {"name": name, "exit_code": state.get("code"), "end_reason": reason.value,
            **({"why": why} if why else {})}


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
    states, now, dumps = fetch_states(info)
    summary = summarize(info, states, now)
    if summary is not None:
        if dumps:  # the nodes found the run hung (detached): read their dumps here
            summary["hang"] = read_hang_dumps(dumps, run)
        run.write_summary(summary)
    return summary


def read_hang_dumps(dumps: dict[str, dict], run: RunDir) -> dict[str, Any]:
    """The nodes' own hang dumps (node/supervise.py, STATE/hang/<node>.json), read as
    `diagnose` reads its own: into runs/<run>/hang/, with the suspects named."""
    nodes = [NodeDumps(name, d.get("ranks") or [],
                       None if d.get("ranks") else "no worker of this run ran there")
             for name, d in sorted(dumps.items())]
    diagnosis = analyse([nodes], run.path / "hang")
    first = min(dumps.values(), key=lambda d: float(d.get("detected_at", 0)))
    return {"detected_at": iso(float(first.get("detected_at", 0))),
            "quiet_s": first.get("quiet_s"), "found_by": "the nodes (detached run)",
            **diagnosis.to_json()}
