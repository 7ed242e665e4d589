"""A training run: preflight, sync the code, start torchrun on every node, stream logs,
tear down (run_training, for `train`); follow a running one (attach_run, for `attach`);
its summary and how it concluded.

    python -m orchestrator train --nodes 2 ddp.py -- --epochs 3
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .. import defaults
from ..checks.preflight import print_report, raise_if_blocked, run_preflight
from ..checks.probe import NodeFacts, release_port
from ..cluster.inventory import Cluster, load_cluster
from ..cluster.ssh import connect_all
from ..errors import ClusterError, LaunchError
from ..node.protocol import GO
from .command import NodeCommand, TorchrunOptions
from .follow import HangWatch, Job
from .launch import Launch
from .record import (
    RunDir,
    code_revision,
    new_run_id,
    open_run,
    run_state_dir,
)
from .settle import settle
from .status import RunStatus, conclude, cut_short, make_summary
from .sync import SyncResult, left_out, sync_code

MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class TrainRequest:
    """The user's request, checked before any node is touched."""

    workdir: Path | None         # None: nothing to sync (a module of the node package)
    script: str
    script_args: tuple[str, ...]
    env: dict[str, str]
    nproc: int | None            # None: auto (GPUs per node, or 1 with gloo)
    master_port: int | None      # None: the inventory's rendezvous port, moved if taken
    options: TorchrunOptions
    module: bool = False         # script is a module name (`-m pkg.mod`)
    clean_exit: bool = True      # workers start through the runner (node/worker.py)
    runs_dir: Path = defaults.RUNS_DIR   # where the run's record goes
    detach: bool = False         # return once the job runs; the nodes supervise it
    dry_run: bool = False        # check the nodes and print the commands; start nothing
    lease_timeout: float = defaults.LEASE_TIMEOUT
    grace: float = defaults.GRACE
    keep_runs: int = defaults.KEEP_RUNS
    run_id: str | None = None    # its record, runs_dir/RUN_ID/ (None: a new id at the start)


def check_grace(grace: float) -> None:
    if not math.isfinite(grace) or grace < 0:
        raise LaunchError(f"--grace {grace}: give the seconds between SIGTERM and SIGKILL "
                          f"as a number of 0 or more (default {defaults.GRACE:g})")


def run_training(request: TrainRequest, watch: HangWatch, cluster: Cluster) -> int:
    """Preflight CLUSTER's nodes, sync the code, launch torchrun everywhere and follow the
    run to its end (or, detached, until it runs); the run's exit status. Every exit path
    leaves a summary and no claim on node 0's master port."""
    run_id = request.run_id or new_run_id()
    report = run_preflight(cluster, request.master_port,
                           strict_port=request.master_port is not None,
                           keep_connections=True, nproc_per_node=request.nproc,
                           run_id=None if request.dry_run else run_id)
    try:
        print_report(report)
        raise_if_blocked(report)
        commands = [
            NodeCommand(run_id=run_id, node_rank=i, synced=request.workdir is not None,
                        nnodes=len(cluster.nodes),
                        nproc=report.nproc(facts),
                        master_addr=report.master_addr or cluster.nodes[0].cluster_address,
                        master_port=report.master_port or cluster.rendezvous_port,
                        torchrun=_torchrun(facts), home=str(facts.home),
                        script=request.script, script_args=request.script_args,
                        env={"CLUSTERTRAIN_BACKEND": report.backend, **request.env},
                        options=request.options, node=facts.node.name,
                        nodes=tuple(cluster.names), python=facts.node.python,
                        run_state=run_state_dir(cluster.shared_path, str(facts.user), run_id),
                        attached=not request.detach, lease_timeout=request.lease_timeout,
                        grace=request.grace, keep_runs=request.keep_runs, module=request.module,
                        clean_exit=request.clean_exit,
                        hang_timeout=watch.timeout, on_hang=str(watch.on_hang),
                        cluster_env=facts.node.cluster_env_file)
            for i, facts in enumerate(report.facts)]
        facts_by = {f.node.name: f for f in report.facts}
        if request.dry_run:
            for spec, cmd in zip(cluster.nodes, commands, strict=True):
                print(f"# {spec.name} ({facts_by[spec.name].user}@{spec.host}), node rank "
                      f"{cmd.node_rank}")
                print(cmd.shell())
            where = (f"code would be synced from {request.workdir.resolve()} to "
                     f"{commands[0].code_dir}" if request.workdir else "nothing to sync")
            print(f"# dry run: {where}; each line loads the supervisor (the node package's, "
                  f"copied to a node that lacks this version) and starts torchrun on the "
                  f"word {GO!r} (sent to every node at once); nothing was started")
            return 0
        run = RunDir(request.runs_dir, run_id)
        info = {
            "run_id": run_id, "inventory": str(cluster.inventory.resolve()),
            "nodes": cluster.names,
            "workdir": str(request.workdir.resolve()) if request.workdir else None,
            "users": {f.node.name: f.user for f in report.facts},
            "script": request.script, "script_args": list(request.script_args),
            "module": request.module, "clean_exit": request.clean_exit,
            "master": {"addr": commands[0].master_addr, "port": commands[0].master_port},
            "commands": {s.name: c.torchrun_argv()
                         for s, c in zip(cluster.nodes, commands, strict=True)},
            "code_revision": code_revision(request.workdir) if request.workdir else None,
            "fingerprint": report.fingerprint,
            "detached": request.detach,
            "hang_timeout": watch.timeout, "on_hang": str(watch.on_hang),
            "node_commands": {c.node: c.to_record() for c in commands},
        }
        run.create(info)
        started = time.time()
        nodes = list(zip(cluster.nodes, commands, strict=True))
        launch: Launch | None = None
        try:
            if request.workdir:
                print(f"run {run_id}: syncing {request.workdir.resolve()} to "
                      f"{len(cluster.nodes)} node(s)", flush=True)
            # The nodes load their supervisors while the code syncs (launch.py).
            launch = Launch.start(nodes, report.clients)
            synced = sync_code(cluster, request.workdir, run_id, clients=report.clients,
                               exclude=left_out(request.workdir, request.runs_dir)) \
                if request.workdir else SyncResult(run_id, 0.0)
            if synced.reused:
                print(f"run {run_id}: code unchanged since the last sync on "
                      f"{', '.join(synced.reused)}: snapshot linked, not copied", flush=True)
            print(f"run {run_id}: " + (f"code synced in {synced.seconds:.1f} s; " if
                                       request.workdir else "") +
                  f"starting torchrun on {', '.join(cluster.names)} (master "
                  f"{commands[0].master_addr}:{commands[0].master_port})", flush=True)
            job = Job(run, nodes, report.clients, grace=request.grace, hang=watch)
            failed = job.launch(launch)
            if failed:
                first = next(n for n in cluster.names if n in failed)
                raise LaunchError(f"{first}: {failed[first]}; " + (
                    "the job was stopped on the other nodes" if launch.started else
                    "no node was started"))
            if request.detach:
                print(f"run {run_id}: running on {', '.join(cluster.names)}, supervised by "
                      "the nodes (detached).\n"
                      f"  follow it: python -m orchestrator attach {run_id} "
                      f"--runs-dir {request.runs_dir}\n"
                      f"  stop it:   python -m orchestrator stop {run_id} "
                      f"--runs-dir {request.runs_dir}", flush=True)
                return 0
            result = job.run(attached=True)
        except BaseException as exc:
            if launch is not None:
                launch.cancel()  # nodes still waiting for the word start nothing
            # Every exit path leaves a summary: never a record that says "running" for a
            # run that is gone.
            interrupted = isinstance(exc, KeyboardInterrupt)
            run.write_summary(cut_short(
                info, RunStatus.INTERRUPTED if interrupted else RunStatus.FAILED, started,
                (str(exc) or "Ctrl-C") if interrupted else str(exc) or repr(exc),
                launch.started if launch is not None else ()))
            raise
        summary = make_summary(info, commands, cluster.names, result, synced.seconds, run)
        run.write_summary(summary)
        return conclude(run, result, summary)
    finally:
        node0 = report.clients.get(cluster.nodes[0].name)
        if node0 is not None and not request.dry_run:
            try:
                release_port(cluster.nodes[0], node0, run_id)
            except (OSError, TimeoutError, RuntimeError):
                pass  # the claim lapses by itself
        report.close()


def attach_run(runs_dir: Path, run_id: str, tail: int | None = None) -> int:
    """Follow a running run's logs (from the start, or each node's last TAIL lines) until
    it ends, and conclude as train does; Ctrl-C only stops following (130)."""
    run = open_run(runs_dir, run_id)
    info = run.info()
    records = info.get("node_commands")
    if not records:
        raise ClusterError(f"run {run_id} was started by an older version and cannot be "
                           "attached to; see `logs` instead")
    summary = run.summary()
    if summary is not None:
        print(f"run {run_id} has ended ({summary['status']}); its logs: "
              f"python -m orchestrator logs {run_id}")
        return 0 if summary["status"] == RunStatus.SUCCEEDED else 1
    cluster = load_cluster(info["inventory"]).select(hosts=",".join(info["nodes"]))
    commands = [NodeCommand.from_record(records[n]) for n in cluster.names]
    clients = connect_all(list(cluster.nodes))
    try:
        if tail is None:  # the whole log again: the local copy starts over
            for name in cluster.names:
                run.log(name).write_text("")
        job = Job(run, list(zip(cluster.nodes, commands, strict=True)), clients)
        job.tail = tail
        result = job.run(attached=False)
    finally:
        for conn in clients.values():
            conn.close()
    if result.interrupted:
        return 130
    summary = settle(run) or make_summary(info, commands, cluster.names, result, 0.0, run)
    if run.summary() is None:
        run.write_summary(summary)
    return conclude(run, result, summary)


def _torchrun(facts: NodeFacts) -> str:
    """The node's torchrun; raise_if_blocked refused every node whose python_env is unset."""
    assert facts.python_env is not None
    return facts.python_env["torchrun"]


