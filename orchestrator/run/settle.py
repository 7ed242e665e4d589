"""A run's record, settled from what the nodes wrote on the shared filesystem.

A run whose controller went away (detached, killed, a closed laptop) has no
summary.json yet; the nodes' supervisors kept its state (node/supervise.py: one JSON file per
node, a heartbeat while running, the exit status and why at the end). `settle` reads it
through any node that answers and, once the run is over, writes the summary, so no
record says "running" for a run that is gone.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..cluster import ssh
from ..cluster.fanout import each
from ..cluster.inventory import NodeSpec, load_cluster
from ..diagnosis.dumps import read_node_dumps
from ..errors import ClusterError
from ..node.answers import StatesAnswer
from ..record.rundir import RunDir, latest_attempt, write_private
from ..record.status import ends_of, summarize
from ..record.summary import Recovery, RunStatus, Summary
from .command import EXIT_MARKER, NodeCommand
from .conclude import write_summary
from .job import whole_log
from .recovery import attempt_info, node_failure
from .scheduler import scheduler_for, slurm_job_of

# Who found a detached run hung, in its summary.
DETACHED = "the nodes (detached run)"
FETCH_TIMEOUT = 60.0   # seconds for a node's whole log of a run that has ended


def node_states(info: dict[str, Any]) -> StatesAnswer:
    """What the run's nodes left on the share (their states, hang dumps and, a detached run
    that may recover, their decision of its next attempt), read through the run's
    scheduler from the first node that answers."""
    cluster = load_cluster(info["inventory"]).select(hosts=",".join(info["nodes"]))
    commands = info.get("node_commands") or {}
    nodes = [(spec, commands[spec.name]["run_state"]) for spec in cluster.nodes
             if (commands.get(spec.name) or {}).get("run_state")]
    return scheduler_for(slurm_job_of(info)).describe(nodes)


def settle(run: RunDir) -> Summary | None:
    """The run's summary: the one on disk, else one settled from the nodes and written
    (None while the run is still running)."""
    summary = run.summary()
    if summary is not None:
        return summary
    info = run.info("inventory")   # its nodes are asked through it
    if info.get("queued"):   # still waiting in Slurm's queue, or its train is gone
        from .allocation import settle_queued
        return settle_queued(run, info)
    found = node_states(info)
    if ends_of(info["nodes"], found.states, found.now) is None:
        return None   # still running
    fetch_logs(run, info)   # the rule reads how its ranks ended from them too
    summary = summarize(info, found.states, found.now, run)
    if summary is not None:
        if found.hang:  # the nodes found the run hung (detached): read their dumps here
            summary = replace(summary, hang=read_hang_dumps(found.hang, run))
        summary = recorded(run, info, summary, found.next)
        write_summary(run, summary)
    return summary


def fetch_logs(run: RunDir, info: dict[str, Any]) -> None:
    """Each node's whole log of RUN, ended with nobody following it (detached, or its
    controller gone), into the run's record in place of the lines followed before: the
    node's copy goes with its job directory (--keep-runs). A node whose log cannot be read
    leaves the lines followed."""
    records = info.get("node_commands") or {}
    cluster = load_cluster(info["inventory"]).select(hosts=",".join(info["nodes"]))

    def one(spec: NodeSpec) -> None:
        conn = ssh.connect(spec.name, spec.ssh, within=FETCH_TIMEOUT)
        try:
            done = conn.run(NodeCommand.from_record(records[spec.name]).follow(),
                            timeout=FETCH_TIMEOUT)
        finally:
            conn.close()
        if EXIT_MARKER not in done.stdout:   # the follow's own end (its code: torchrun's)
            raise ClusterError(f"{spec.name}: its log could not be read: "
                               f"{(done.stderr or done.stdout).strip()[-200:]}")
        lines = whole_log(spec.name, done.stdout.encode())
        if len(lines) < _line_count(run.log(spec.name)):   # its job directory was pruned
            raise ClusterError(f"{spec.name}: its copy of the log is gone (--keep-runs)")
        write_private(run.log(spec.name), "".join(line + "\n" for line in lines))

    each([s for s in cluster.nodes if records.get(s.name)], one, lambda s: s.name)


def _line_count(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def recorded(run: RunDir, info: dict[str, Any], summary: Summary,
             decision: dict | None) -> Summary:
    """The summary of an attempt of a detached run that may recover, with what its nodes
    did: the recovery that started it (completed from its end), and the attempt they
    started after it failed (DECISION: recorded here as a run of its own, `recovered_in`)."""
    if not info.get("recovery_plan"):
        return summary
    if info.get("recovery") and not summary.recoveries:
        recovery = Recovery.from_json(info["recovery"])
        earlier = summary_of(run.root, recovery.failed_run)
        summary = with_recovery(run, info["recovery_plan"]["run_id"], recovery,
                                list(earlier.recoveries) if earlier else [], summary)
    if decision and not decision.get("attempt"):   # the last attempt: its lost node kept out
        why = f"{decision.get('node')} lost mid-run {decision.get('failed_run')} " \
              f"({decision.get('why')})"
        summary = replace(
            summary, cordoned={decision["node"]: why} if decision.get("cordoned") else
            summary.cordoned, drained={decision["node"]: why} if decision.get("drained")
            else summary.drained)
    if decision and decision.get("attempt") and summary.status != RunStatus.SUCCEEDED:
        following = RunDir(run.root, str(decision["run_id"]))
        if not following.run_json.exists():
            following.create(attempt_info(info, decision))
        summary = replace(summary, recovered_in=following.run_id)
    return summary


def next_attempt(run: RunDir, wait: float = 0.0) -> RunDir | None:
    """The attempt that followed RUN (ended): the controller's (`recovered_in`), or one a
    detached run's nodes started, recorded now; None when none did. WAIT: seconds to wait
    for the nodes' decision on a run that failed by a node's fault (they name a lost node
    PEER_TIMEOUT after its last word)."""
    summary = run.summary()
    if summary is not None and summary.recovered_in:
        return RunDir(run.root, summary.recovered_in)
    info = run.info()
    if not info.get("recovery_plan") or summary is None or node_failure(summary) is None:
        return None
    deadline = time.monotonic() + wait
    while True:
        decision = recovery_decision(info)
        if decision is not None or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    summary = recorded(run, info, summary, decision)
    if not summary.recovered_in:
        return None
    write_summary(run, summary)
    return RunDir(run.root, summary.recovered_in)


def recovery_decision(info: dict[str, Any]) -> dict | None:
    """The decision a detached run's nodes wrote when this attempt failed by a node's
    fault (node/recover.py), or None (none yet, none to be, or no node answers)."""
    if not info.get("recovery_plan"):
        return None
    try:
        decision = node_states(info).next
    except OSError:
        return None
    return decision if decision and decision.get("attempt") else None


def current_attempt(run: RunDir) -> RunDir:
    """The attempt of RUN that runs now (or ran last): the controller's recoveries, then
    those a detached run's nodes started (each ended attempt settled and asked)."""
    run = latest_attempt(run)
    while True:
        try:
            if settle(run) is None:
                break
        except OSError:   # no node answers: the latest attempt known here
            break
        following = next_attempt(run)
        if following is None:
            break
        run = following
    return run


def with_recovery(run: RunDir, first: str, recovery: Recovery, earlier: list[Recovery],
                  summary: Summary) -> Summary:
    """The summary of RUN, the attempt RECOVERY started (of the run FIRST, after the
    recoveries EARLIER), with that recovery completed from what its end tells (when it
    trained again, from which checkpoint) and every recovery so far."""
    previous = summary_of(run.root, recovery.failed_run)
    log = ""
    try:
        log = run.log(recovery.nodes[0]).read_text(encoding="utf-8", errors="replace")
    except OSError:
        pass
    done = recovery.completed(summary.start, summary.first_step_at, log,
                              previous.last_step if previous else None)
    return replace(summary, recovery_of=first, recoveries=(*earlier, done))


def summary_of(root: Path, run_id: str) -> Summary | None:
    """Run RUN_ID's summary in ROOT, None when it has none or it does not read."""
    try:
        return RunDir(root, run_id).summary()
    except ClusterError:
        return None


def read_hang_dumps(dumps: dict[str, dict], run: RunDir) -> dict[str, Any]:
    """The hang dumps the nodes of a detached run left on the share, read into the run's
    record (runs/<run>/hang/), as the controller of an attached run reads them."""
    return read_node_dumps(dumps, run.path / "hang", DETACHED)
