"""A run, phase by phase (SkyPilot's lifecycle phases as the model):

    check      preflight every node; the session keeps its connections and node 0's port
    plan       each node's command, from the spec and what preflight found (a dry run
               prints the plan; a run runs this very plan)
    sync       the code into a per-run snapshot on every node
    launch     the supervisors on every node at once (the scheduler; during the sync)
    supervise  follow every node's log to the end (attached), or leave it to the nodes
    conclude   the run's summary: the one status rule (record/status.py), written on every exit
               path, and said
    recover    with --max-recoveries, an end that was a node's fault: the failed node kept
               out, the whole run again (check to conclude) as RUN.r1 on the healthy nodes
               and a spare, from the job's newest checkpoint (recovery.py)

    python -m orchestrator train --nodes 2 ddp.py -- --epochs 3
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import defaults
from ..checks.preflight import print_report, raise_if_blocked
from ..checks.probe import NodeFacts
from ..cluster import nodelib, ssh
from ..cluster.inventory import Cluster, NodeSpec, load_cluster
from ..cluster.ssh import connect_all
from ..errors import ClusterError, InputError, LaunchError
from ..node import requests as rq
from ..node.protocol import GO, JOBS_SUBDIR, PEER_TIMEOUT, STARTED
from ..node.recover import DECISION_WAIT, plan_path
from ..record.rundir import (
    RecordUnreadable,
    RunDir,
    code_revision,
    iso,
    latest_attempt,
    new_run_id,
    open_run,
    run_state_dir,
    write_private,
)
from ..record.status import cut_short
from ..record.summary import Recovery, RunStatus, Summary
from .allocation import Allocation, queue_for
from .command import NodeCommand, state_dir
from .conclude import conclude, make_summary, write_summary
from .job import Job
from .recovery import (
    RECOVERY_ENV,
    Failure,
    SpareFacts,
    attempt_id,
    detached_plan,
    exhausted,
    keep_out_lost,
    next_nodes,
    node_failure,
    spares_of,
)
from .scheduler import Scheduler, scheduler_for, slurm_job_of
from .secret import RunSecrets
from .session import Session, Take, connected_ahead
from .settle import (
    next_attempt,
    node_states,
    recovery_decision,
    settle,
    summary_of,
    with_recovery,
)
from .spec import RunSpec
from .sync import SyncResult, left_out, sync_code

# What an attached run serves while it is followed, given node 0's command, the node and
# its connection (workloads/notebook_run.py's tunnel).
Serving = Callable[[NodeCommand, NodeSpec, Any], AbstractContextManager[Any]]


@dataclass(frozen=True)
class Plan:
    """What will run where: the spec and each node's command. The dry run's object is
    the object that runs."""

    spec: RunSpec
    run_id: str
    nodes: list[tuple[NodeSpec, NodeCommand]]
    users: dict[str, str]
    allocation: Allocation | None = None     # --queue: what Slurm gave the run

    recovery: Recovery | None = None          # the recovery that started this attempt
    spares: tuple[str, ...] = ()              # detached, may recover: the spares held ready
    secrets: RunSecrets = field(default_factory=RunSecrets)   # the ring's key, secret env

    @classmethod
    def make(cls, spec: RunSpec, session: Session, run_id: str,
             allocation: Allocation | None = None, recovery: Recovery | None = None,
             spares: Sequence[str] = ()) -> Plan:
        report, cluster = session.report, session.cluster
        given = allocation.env if allocation else (lambda node: {})
        # A run that may recover: every attempt knows its number (0 the first).
        attempt = ({RECOVERY_ENV: str(recovery.attempt if recovery else 0)}
                   if spec.max_recoveries else {})
        commands = [
            NodeCommand(run_id=run_id, node_rank=i, synced=spec.workdir is not None,
                        nnodes=len(cluster.nodes), nproc=report.nproc(facts),
                        master_addr=report.master_addr or cluster.nodes[0].cluster_address,
                        master_port=report.master_port or cluster.rendezvous_port,
                        torchrun=_torchrun(facts), home=str(facts.home),
                        script=spec.script, script_args=spec.script_args,
                        env={"CLUSTERTRAIN_BACKEND": report.backend, **spec.env,
                             **given(facts.node.name), **attempt},
                        options=spec.options, node=facts.node.name,
                        nodes=tuple(cluster.names), python=facts.node.python,
                        addresses=tuple(n.cluster_address for n in cluster.nodes),
                        run_state=run_state_dir(cluster.shared_path, str(facts.user), run_id),
                        attached=not spec.detach, lease_timeout=spec.lease_timeout,
                        grace=spec.grace, keep_runs=spec.keep_runs, module=spec.module,
                        clean_exit=spec.clean_exit, hang_timeout=spec.hang_timeout,
                        on_hang=str(spec.on_hang), cluster_env=facts.node.cluster_env_file,
                        recovery=bool(spec.detach and spec.max_recoveries),
                        ring_ports=cluster.ring_ports)
            for i, facts in enumerate(report.facts)]
        return cls(spec, run_id, list(zip(cluster.nodes, commands, strict=True)),
                   {f.node.name: str(f.user) for f in report.facts}, allocation, recovery,
                   tuple(spares), RunSecrets.of(spec.secret_env))

    @property
    def commands(self) -> list[NodeCommand]:
        return [c for _, c in self.nodes]

    def describe(self) -> str:
        """The dry run: each node's launch line, what would happen, then the spec as a
        job file (YAML: the lines before it are comments, so that the output is one
        `train -f` accepts back)."""
        lines = []
        for spec, cmd in self.nodes:
            lines += [f"# {spec.name} ({self.users[spec.name]}@{spec.host}), node rank "
                      f"{cmd.node_rank}", f"# {cmd.shell()}"]
        where = (f"code would be synced from {self.spec.workdir} to "
                 f"{self.commands[0].code_dir}" if self.spec.workdir else "nothing to sync")
        lines.append(f"# dry run: {where}; each line loads the supervisor (the node "
                     "package's, copied to a node that lacks this version) and starts "
                     f"torchrun on the word {GO!r} (sent to every node at once); nothing "
                     "was started. The run, as a job file (train -f FILE):")
        return "\n".join(lines) + "\n" + self.spec.to_yaml()

    def record(self, session: Session) -> dict[str, Any]:
        """What run.json keeps of the run: its spec, where and as whom it runs, and each
        node's command (attach, runs, stop and diagnose rebuild from it)."""
        spec, first = self.spec, self.commands[0]
        return {
            "run_id": self.run_id, "inventory": str(session.cluster.inventory.resolve()),
            "nodes": session.cluster.names,
            "workdir": str(spec.workdir) if spec.workdir else None,
            "users": self.users, "script": spec.script, "script_args": list(spec.script_args),
            "module": spec.module, "clean_exit": spec.clean_exit,
            "master": {"addr": first.master_addr, "port": first.master_port},
            "commands": {s.name: c.torchrun_argv() for s, c in self.nodes},
            "code_revision": code_revision(spec.workdir) if spec.workdir else None,
            "fingerprint": session.report.fingerprint, "detached": spec.detach,
            # the state of the environment the run runs in (the cluster's are versioned:
            # a re-provisioning makes a new one beside it, and this run keeps its own)
            "env_prefix": (session.report.facts[0].python_env or {}).get("prefix"),
            "python_env": {"name": spec.python_env, "dir": session.report.facts[0].env_dir}
            if spec.python_env else None,
            "hang_timeout": spec.hang_timeout, "on_hang": str(spec.on_hang),
            "gpu_idle": spec.gpu_idle,
            "node_commands": {c.node: c.to_record() for c in self.commands},
            "spec": spec.to_file(),
            "slurm": self.allocation.record() if self.allocation else None,
            **({"recovery": self.recovery.to_json()} if self.recovery else {}),
        }


@dataclass(frozen=True)
class Nodes:
    """The nodes a run may use, read and checked before anything is asked of them."""
    whole: Cluster       # the inventory's
    cluster: Cluster     # the run's
    spares: list[str]    # the spares of --max-recoveries, checked


def choose_nodes(spec: RunSpec, cluster: Cluster | None = None) -> Nodes:
    """SPEC's nodes (CLUSTER: already read), its --queue and its spares checked against
    the inventory: LaunchError before any node is contacted."""
    whole = (cluster or load_cluster(spec.inventory)).with_user_env(spec.python_env)
    cluster = (cluster or whole.select(
        spec.nodes, ",".join(spec.hosts) if spec.hosts is not None else None)
        ).with_user_env(spec.python_env)
    if spec.queue and whole.scheduler != "slurm":
        raise InputError(
            f"--queue: the inventory {whole.inventory} says cluster_scheduler: "
            f"{whole.scheduler}, so the cluster runs no Slurm; set cluster_scheduler: slurm "
            "and run site.yml (roles/slurm), or leave out --queue")
    spares = spares_of(whole.names, cluster.names, spec.spares, spec.spare_hosts,
                       whole.inventory, spec.min_nodes) if spec.max_recoveries else []
    return Nodes(whole, cluster, spares)


def run_training(spec: RunSpec, dry_run: bool = False, nodes: Nodes | None = None,
                 serving: Serving | None = None) -> int:
    """A run's phases, from its check to its conclusion (or, detached, until it runs on
    every node); the run's exit status. Every exit path leaves a summary and no claim on
    node 0's master port. NODES: the spec's nodes, already chosen (choose_nodes).
    SERVING: what an attached run serves while it is followed (the notebook's tunnel)."""
    nodes = nodes or choose_nodes(spec)
    whole, cluster, spares = nodes.whole, nodes.cluster, list(nodes.spares)
    run_id = spec.run_id or new_run_id()
    if spec.max_recoveries and not dry_run and not spec.detach:
        return _recovering(spec, whole, cluster, spares, run_id)
    if spec.max_recoveries and dry_run:
        print(f"# dry run: a node's failure would start the run again from its newest "
              f"checkpoint, at most {spec.max_recoveries} time(s), as "
              f"{attempt_id(run_id, 1)}, ... on "
              f"the healthy nodes and a spare ({', '.join(spares) or 'none held'})"
              + (f", or on {spec.min_nodes} node(s) or more" if spec.min_nodes else ""))
    return _attempt(spec, whole, cluster, run_id, dry_run, spares=spares, serving=serving)


def _recovering(spec: RunSpec, whole: Cluster, cluster: Cluster, spares: list[str],
                run_id: str) -> int:
    """A run that may recover (--max-recoveries): attempts, each a run of its own
    (recovery.py), until one ends other than by a node's fault or the recoveries are
    used up. The failed node is left out (cordoned when lost) and a spare takes its place."""
    failures: list[Failure] = []
    done: list[Recovery] = []
    recovery: Recovery | None = None
    names = cluster.names
    for attempt in range(spec.max_recoveries + 1):
        rid = attempt_id(run_id, attempt)
        try:
            code = _attempt(replace(spec, run_id=rid), whole,
                            whole.select(hosts=",".join(names)), rid, False, recovery)
        except LaunchError as exc:
            summary = summary_of(spec.runs_dir, rid)
            failure = node_failure(summary) if summary else None
            _finish_recovery(spec.runs_dir, run_id, rid, recovery, done, summary)
            if failure is None or summary is None:
                raise
            failures.append(failure)
            print(exc, file=sys.stderr, flush=True)   # this attempt's failure, in full
            if attempt == spec.max_recoveries:
                raise exhausted(run_id, failures, spec.max_recoveries) from None
            names, spare = next_nodes(names, failure.node, spares, spec.min_nodes)
            recovery = Recovery(attempt + 1, rid, failure.node, failure.why, failure.at,
                                attempt_id(run_id, attempt + 1), names, spare,
                                failure.node in summary.cordoned,
                                _last_heard(summary, failure, names))
            _mark_recovered(spec.runs_dir, rid, recovery.run_id)
            print(f"run {rid}: {failure.node} {failure.why}; recovery {attempt + 1} of "
                  f"{spec.max_recoveries}: starting again from the newest checkpoint as "
                  f"{recovery.run_id} on {', '.join(names)}"
                  + (f" ({spare}, a spare, in {failure.node}'s place)" if spare else
                     " (fewer nodes: --min-nodes)"), flush=True)
            continue
        _finish_recovery(spec.runs_dir, run_id, rid, recovery, done,
                         summary_of(spec.runs_dir, rid))
        for told in done:
            print(f"run {rid}: {told.line()}", flush=True)
        return code
    raise AssertionError("not reached: the last attempt returns or raises")


def _last_heard(summary: Summary, failure: Failure, healthy: list[str]) -> str | None:
    """When a lost node was last heard over the network (ISO), as the nodes that heard its
    beats recorded in their ends on the share (`heard`), read through a node that is well:
    nearer its death than when the loss was seen. Else the lost node's last state on the
    share; None when neither can be read."""
    if not failure.lost:
        return None
    try:
        nodes = [n.name for n in summary.nodes if n.name in healthy]
        states = node_states({**summary.info, "nodes": nodes}).states
        heard = [float(s["heard"][failure.node]) for s in states.values()
                 if isinstance((s.get("heard") or {}).get(failure.node), (int, float))]
        return iso(max(heard) if heard else float(states[failure.node]["time"]))
    except Exception:  # noqa: BLE001 - the record goes without it
        return None


def _finish_recovery(runs_dir: Path, first: str, run_id: str, recovery: Recovery | None,
                     done: list[Recovery], summary: Summary | None) -> None:
    """The attempt RUN_ID (started by RECOVERY) of the run FIRST ended: complete that
    recovery from what its end tells, and write every recovery so far into its summary."""
    if recovery is None or summary is None:
        return
    run = RunDir(runs_dir, run_id)
    summary = with_recovery(run, first, recovery, list(done), summary)
    write_summary(run, summary)
    done.append(summary.recoveries[-1])


def _mark_recovered(runs_dir: Path, run_id: str, next_id: str) -> None:
    """A failed attempt's summary names the attempt that followed it."""
    summary = summary_of(runs_dir, run_id)
    if summary is not None:
        write_summary(RunDir(runs_dir, run_id), replace(summary, recovered_in=next_id))


def _attempt(spec: RunSpec, whole: Cluster, cluster: Cluster, run_id: str, dry_run: bool,
             recovery: Recovery | None = None, spares: Sequence[str] = (),
             serving: Serving | None = None) -> int:
    """One run on CLUSTER: its check, its launch and its end (or, dry, its plan)."""
    with connected_ahead(_nodes_ahead(spec, whole, cluster) if not dry_run else None) as take:
        allocation = None
        if spec.queue and dry_run:
            print(f"# dry run: --queue would ask Slurm (from {whole.names[0]}) for "
                  f"{len(cluster.nodes)} node(s), "
                  f"{'every' if spec.gpus_per_node is None else spec.gpus_per_node} GPU(s) "
                  "per node; Slurm chooses the nodes: the plan below is for "
                  f"{', '.join(cluster.names)}; nothing was asked")
        elif spec.queue:
            allocation = queue_for(spec, whole, len(cluster.nodes), run_id)
        try:
            if allocation is not None:
                cluster = whole.select(hosts=",".join(allocation.nodes))
                print(f"run {run_id}: Slurm job {allocation.job_id} granted after "
                      f"{allocation.waited_s:.1f} s: {allocation.describe()}", flush=True)
            nproc = spec.nproc_per_node or (allocation.gpus_per_node if allocation else None)
            # Through the queue, Slurm shares out the nodes: its other jobs there hold other
            # GPUs and are no refusal, but a run started outside Slurm is (issue 69: Slurm
            # counts its GPUs free); --queue is no --share-gpus.
            with Session.check(cluster, master_port=spec.master_port, nproc_per_node=nproc,
                               share_gpus=spec.share_gpus,
                               queued_gpus=_queued_gpus(spec, allocation),
                               cordoned_ok=spec.cordoned_ok,
                               run_id=None if dry_run else run_id,
                               opened=_opened(take, cluster, allocation)) as session:
                print_report(session.report, comment=dry_run)
                raise_if_blocked(session.report)
                plan = Plan.make(spec, session, run_id, allocation, recovery,
                                 spares if spec.detach else ())
                if dry_run:
                    print(plan.describe(), end="")
                    return 0
                code = _run(plan, session, scheduler_for(
                    allocation.job_id if allocation else None, session.clients), whole, serving)
            # After the session's end, which may still use the allocation's connection.
            if spec.detach and allocation is not None:
                allocation.keep()   # running on the nodes: they give it back at the end
            elif allocation is not None:   # its job ends as the run did (sacct)
                allocation.end(_status(RunDir(spec.runs_dir, run_id)))
            return code
        except BaseException as exc:
            if allocation is not None:
                _ended_unrun(RunDir(spec.runs_dir, run_id), exc)
            raise
        finally:
            if allocation is not None:
                allocation.release()


def _status(run: RunDir) -> RunStatus | None:
    """The status RUN's summary gives it, None without one (or one that does not read)."""
    try:
        summary = run.summary()
    except (OSError, RecordUnreadable):
        return None
    return summary.status if summary is not None else None


def _ended_unrun(run: RunDir, exc: BaseException) -> None:
    """A --queue run that Slurm granted but that ended before it ran (its check refused
    it, Ctrl-C): the record it had while it waited gets its summary, as a run refused in
    the queue does (queue_for); without one, `runs` would say its train was lost. A run
    that ran wrote its own."""
    try:
        if run.summary() is not None:
            return
        interrupted = isinstance(exc, KeyboardInterrupt)
        write_summary(run, cut_short(
            run.info(), RunStatus.INTERRUPTED if interrupted else RunStatus.FAILED,
            time.time(), (str(exc) or "Ctrl-C") if interrupted else str(exc) or repr(exc)))
    except Exception:  # noqa: BLE001 - the refusal itself is what the user must see
        pass


def _queued_gpus(spec: RunSpec, allocation: Allocation | None) -> dict[str, list[int]] | None:
    """The GPUs Slurm gave a --queue run on each node ({}: a dry run, none asked for);
    None for a run that does not queue."""
    if not spec.queue:
        return None
    return dict(allocation.gpus) if allocation is not None else {}


def _nodes_ahead(spec: RunSpec, whole: Cluster, cluster: Cluster) -> Cluster | None:
    """The nodes a --queue run connects to while Slurm grants its allocation, so that the
    check after the grant finds open the ones Slurm chose: the --hosts asked for; else the
    first twice-as-many of the inventory (every node of a small cluster), where Slurm looks
    first on an idle cluster (slurm.conf lists the nodes in the inventory's order). Not the
    inventory's first node: the allocation's own connection serves it (_opened). Those
    Slurm did not choose are closed at the grant. None for a run that does not queue."""
    if not spec.queue:
        return None
    ahead = cluster if spec.hosts is not None else \
        whole.select(nodes=min(len(whole.nodes), 2 * len(cluster.nodes)))
    rest = [n for n in ahead.names if n != whole.names[0]]
    return whole.select(hosts=",".join(rest)) if rest else None


def _opened(take: Take, cluster: Cluster, allocation: Allocation | None
            ) -> dict[str, ssh.Connection]:
    """The connections CLUSTER's check starts from: those opened while Slurm granted the
    allocation, and the allocation's own, to the inventory's first node, when Slurm chose
    that node (borrowed: the allocation ends it when it is given back, after the run)."""
    opened = take(cluster)
    conn = allocation.conn if allocation is not None else None
    if conn is not None and conn.name in cluster.names:
        opened[conn.name] = conn.borrowed()
    return opened


def _run(plan: Plan, session: Session, scheduler: Scheduler, whole: Cluster,
         serving: Serving | None = None) -> int:
    spec, cluster, run_id = plan.spec, session.cluster, plan.run_id
    run = RunDir(spec.runs_dir, run_id)
    info = plan.record(session)
    run.create(info, queued=plan.allocation is not None)   # a --queue run: its record again
    started = time.time()
    submitted = None
    try:
        if plan.commands[0].recovery:   # detached, may recover: the nodes need its plan
            info["recovery_plan"] = _arm_recovery(plan, session, whole)
            run.write_json("run.json", info)
        if spec.workdir:
            print(f"run {run_id}: syncing {spec.workdir} to {len(cluster.nodes)} node(s)",
                  flush=True)

        def sync() -> SyncResult:
            synced = SyncResult(run_id, 0.0)
            if spec.workdir:
                synced = sync_code(cluster, spec.workdir, run_id, clients=session.clients,
                                   exclude=left_out(spec.workdir, spec.runs_dir))
            if synced.reused:
                print(f"run {run_id}: code unchanged since the last sync on "
                      f"{', '.join(synced.reused)}: snapshot linked, not copied", flush=True)
            for line in synced.carried_lines():
                print(f"run {run_id}: {line}", flush=True)
            first = plan.commands[0]
            print(f"run {run_id}: " + (f"code synced in {synced.seconds:.1f} s; " if
                                       spec.workdir else "") +
                  f"starting torchrun on {', '.join(cluster.names)} (master "
                  f"{first.master_addr}:{first.master_port})", flush=True)
            return synced

        # The nodes load their supervisors while the code syncs (launch.py).
        submitted = scheduler.submit(plan.nodes, sync, plan.secrets)
        if submitted.failed:
            first_failed = next(n for n in cluster.names if n in submitted.failed)
            raise LaunchError(f"{first_failed}: {submitted.failed[first_failed]}; " + (
                "the job was stopped on the other nodes" if submitted.launch.started else
                "no node was started"))
        session.release_once_bound(plan.commands[0].master_port, detached=spec.detach)
        if spec.detach:
            print(f"run {run_id}: running on {', '.join(cluster.names)}, supervised by "
                  "the nodes (detached).\n"
                  f"  follow it: python -m orchestrator attach {run_id} "
                  f"--runs-dir {spec.runs_dir}\n"
                  f"  stop it:   python -m orchestrator stop {run_id} "
                  f"--runs-dir {spec.runs_dir}", flush=True)
            return 0
        job = Job(run, plan.nodes, scheduler, grace=spec.grace, hang=spec.watch,
                  gpu_idle=spec.gpu_idle)
        node, first = plan.nodes[0]
        with (serving(first, node, session.clients[node.name]) if serving
              else nullcontext()):
            result = job.run(attached=True)
    except BaseException as exc:
        # Every exit path leaves a summary: never a record that says "running" for a
        # run that is gone.
        interrupted = isinstance(exc, KeyboardInterrupt)
        write_summary(run, cut_short(
            info, RunStatus.INTERRUPTED if interrupted else RunStatus.FAILED, started,
            (str(exc) or "Ctrl-C") if interrupted else str(exc) or repr(exc),
            submitted.launch.started if submitted is not None else ()))
        raise
    summary = make_summary(info, plan.commands, cluster.names, result,
                           submitted.meanwhile.seconds, run)
    kept = keep_out_lost(summary, cluster, session.clients)
    summary = replace(summary, cordoned=kept.cordoned, drained=kept.drained)
    write_summary(run, summary)
    return conclude(run, result, summary)


def _arm_recovery(plan: Plan, session: Session, whole: Cluster) -> dict[str, Any]:
    """A detached run that may recover: its spares checked, the code synced to them and a
    standby started on each (it waits for its place), and the plan the nodes recover by
    left on the share (node/recover.py); the plan."""
    spec, first = plan.spec, plan.commands[0]
    with ExitStack() as stack:
        spares = stack.enter_context(_checked_spares(plan, whole)) if plan.spares else None
        facts = {f.node.name: SpareFacts(f.node.cluster_address, f.node.python, _torchrun(f),
                                         str(f.home))
                 for f in (spares.report.facts if spares else [])}
        if spares is not None and spec.workdir:
            sync_code(spares.cluster, spec.workdir, plan.run_id, clients=spares.clients,
                      exclude=left_out(spec.workdir, spec.runs_dir))
        recovery_plan = detached_plan(plan.commands, facts, spec.max_recoveries,
                                      spec.min_nodes, whole.shared_path,
                                      whole.scheduler == "slurm", spec.workdir is not None,
                                      whole.admin_group)
        # The nodes start the next attempts with the run's key and secret variables: they
        # are in the plan on the share (a file only this user reads), not in the record.
        _write_plan(session, first, {**recovery_plan, **plan.secrets.for_plan()})
        if spares is not None:
            for node in spares.cluster.nodes:
                _start_standby(spares, node, facts[node.name], first, plan.run_id)
    print(f"run {plan.run_id}: a node's failure starts it again on the nodes themselves, "
          f"at most {spec.max_recoveries} time(s)" + (
              f"; spare(s) standing by: {', '.join(facts)}" if facts else
              f"; no spare: on {spec.min_nodes} node(s) or more"), flush=True)
    return recovery_plan


def _checked_spares(plan: Plan, whole: Cluster) -> Session:
    """The spares' preflight (their connections kept); LaunchError when one cannot take
    a failed node's place."""
    spec = plan.spec
    checked = Session.check(whole.select(hosts=",".join(plan.spares)), master_port=None,
                            nproc_per_node=spec.nproc_per_node, run_id=None,
                            share_gpus=spec.share_gpus)
    if checked.report.problems:
        checked.close()
        raise LaunchError("a spare cannot take a failed node's place: "
                          + "; ".join(checked.report.problems) + ". Fix it, or choose "
                          "other spares (--spare-hosts)")
    return checked


def _start_standby(spares: Session, node: NodeSpec, facts: SpareFacts, first: NodeCommand,
                   run_id: str) -> None:
    """A spare's standby, detached on it: it waits for a decision that names it."""
    job = f"{state_dir(facts.home)}/{JOBS_SUBDIR}/{run_id}"
    result = nodelib.call(spares.clients[node.name], node.python, rq.Standby(
        plan=plan_path(first.run_state), node=node.name, torchrun=facts.torchrun,
        log=f"{job}/standby.log", detach=True), timeout=60)
    if STARTED not in result.stdout:
        raise LaunchError(f"{node.name}: its standby did not start as a spare: "
                          f"{(result.stderr or result.stdout).strip()[-300:]}")


def _write_plan(session: Session, first: NodeCommand, recovery_plan: dict[str, Any]) -> None:
    node = session.cluster.nodes[0]
    result = nodelib.call(session.clients[node.name], node.python,
                          rq.RecoveryPlan(plan_path(first.run_state)),
                          stdin=json.dumps(recovery_plan), timeout=60)
    if result.exit_code != 0:
        raise LaunchError(f"{node.name}: the recovery plan could not be written to "
                          f"{plan_path(first.run_state)}: {result.stderr.strip()[-300:]}")


def attach_run(runs_dir: Path, run_id: str, tail: int | None = None) -> int:
    """`attach`: follow a running run's logs (from the start, or each node's last TAIL
    lines) until it ends, and conclude as train does; Ctrl-C only stops following (130).
    A run that recovered from a failed node: its latest attempt, then each attempt that
    its nodes started after that one (a detached run), in turn."""
    run = latest_attempt(open_run(runs_dir, run_id))
    if run.run_id != run_id:
        print(f"run {run_id} recovered from a failed node as {run.run_id}; following that")
    code = None
    while True:
        if run.summary() is None and (recovery_decision(run.info()) is None
                                      or settle(run) is None):
            code = _follow(run, tail)   # a run recovered from: its lost node may not answer
            if code == 130:
                return code
        following = next_attempt(run, wait=PEER_TIMEOUT + DECISION_WAIT)
        if following is None:
            break
        told = Recovery.from_json(following.info()["recovery"])
        print(f"run {run.run_id}: {told.node} {told.why}; its nodes started it again as "
              f"{following.run_id} on {', '.join(told.nodes)}"
              + (f" ({told.spare}, a spare, in {told.node}'s place)" if told.spare else "")
              + "; following that", flush=True)
        run, tail, code = following, None, None
    summary = run.summary()
    for told in summary.recoveries if summary else ():
        print(f"run {run.run_id}: {told.line()}", flush=True)
    if code is None:
        print(f"run {run.run_id} has ended ({summary.status if summary else None}); its "
              f"logs: python -m orchestrator logs {run.run_id}")
        return 0 if summary and summary.succeeded else 1
    return code


def _follow(run: RunDir, tail: int | None) -> int:
    """Follow one attempt RUN to its end; its exit status (130: Ctrl-C)."""
    info = run.info()
    records = info.get("node_commands")
    if not records:
        raise ClusterError(f"run {run.run_id} was started by an older version and cannot be "
                           "attached to; see `logs` instead")
    cluster = load_cluster(info["inventory"]).select(hosts=",".join(info["nodes"]))
    commands = [NodeCommand.from_record(records[n]) for n in cluster.names]
    clients = connect_all(list(cluster.nodes))
    try:
        if tail is None:  # the whole log again: the local copy starts over
            for name in cluster.names:
                write_private(run.log(name), "")
        job = Job(run, list(zip(cluster.nodes, commands, strict=True)),
                  scheduler_for(slurm_job_of(info), clients),
                  gpu_idle=float(info.get("gpu_idle", defaults.GPU_IDLE)))
        job.tail = tail
        result = job.run(attached=False)
    finally:
        for conn in clients.values():
            conn.close()
    if result.interrupted:
        return 130
    summary = settle(run) or make_summary(info, commands, cluster.names, result, 0.0, run)
    if run.summary() is None:
        write_summary(run, summary)
    return conclude(run, result, summary)


def _torchrun(facts: NodeFacts) -> str:
    """The node's torchrun; raise_if_blocked refused every node whose python_env is unset."""
    assert facts.python_env is not None
    return facts.python_env["torchrun"]
