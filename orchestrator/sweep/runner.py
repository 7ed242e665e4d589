"""Running a sweep: each trial an ordinary `train` run of the sweep's job with the trial's
parameters appended to the script's arguments, started as a child process of the sweep
(its own session: the sweep alone hears the terminal's Ctrl-C, and hands each trial one),
its output kept in the sweep's directory (tN.log), its run recorded under --runs-dir as
any run's.

How many at once: through Slurm's queue (`queue: true`), up to `parallel` trials ask for
their allocation and Slurm packs them onto free GPUs, in turn with everyone's work;
without it, each trial takes whole free nodes (`nodes` of them, from `hosts` or the
inventory's training nodes), as many trials at once as there are such nodes and
`parallel` allows.

The sweep ends when every trial has ended, when `max_failures` trials failed (the running
ones end on their own; the rest are not run), on Ctrl-C or SIGTERM, or on `sweep stop`
(its running trials are stopped; the rest are not run). With `early_stop`, a running
trial worse than the others at its step is stopped (early.py). `sweep resume` runs again
every trial that neither succeeded nor was stopped early.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from ..cluster.inventory import load_cluster
from ..errors import ClusterError, InventoryError
from ..record.rundir import RunDir, open_private
from ..report.page import final_metrics, read_timeline
from ..run.allocation import hangup_interrupts
from ..run.lifecycle import choose_nodes
from ..run.spec import RunSpec
from . import early
from .record import SweepRecord, TrialRecord, TrialState
from .report import write_sweep_report
from .table import Live

POLL_S = 1.0          # how often the sweep looks at its trials
LOSS_EVERY_S = 10.0   # how often it reads the running trials' latest loss (a window's)
STOP_WAIT_S = 120.0   # after Ctrl-C or `sweep stop`: how long each trial may take to end
TRIAL_ENV = "SWEEP_TRIAL"   # SWEEP.tN, in every rank's environment, the same on resume:
                           # a script names its checkpoints by it (train/train.py does)
QUEUE_PARALLEL = 16   # through the queue, trials waiting or running at once by default
@dataclass
class Running:
    trial: TrialRecord
    proc: subprocess.Popen
    log: IO[bytes]


def trial_spec(base: RunSpec, record: SweepRecord, trial: TrialRecord,
               hosts: list[str] | None) -> RunSpec:
    """TRIAL's run: the sweep's job with the trial's parameters after the script's own
    arguments, its run id, TRIAL_ENV naming the trial, and (without the queue) the nodes
    it was given."""
    spec = replace(base, run_id=record.trial_run_id(trial),
                   script_args=(*base.script_args, *trial.args), runs_dir=record.runs_dir,
                   env={**(base.env or {}), TRIAL_ENV: f"{record.sweep_id}.t{trial.number}"})
    if hosts is not None:
        spec = replace(spec, hosts=tuple(hosts), nodes=None)
    return spec


def check_nodes(base: RunSpec) -> None:
    """Every trial's nodes checked as `train` checks a run's (its own messages), before the
    sweep is recorded and before any node is touched: through the queue, the job itself
    (a cluster with Slurm, `nodes` within the inventory's, `hosts` known and each once);
    without it, `hosts` (the nodes the trials share out) and `nodes` (each trial's: at
    least 1, at most the inventory's or the hosts'), then the first trial's run as train
    reads it (its spares, its environment). InventoryError or InputError."""
    if base.queue:
        choose_nodes(base)
        return
    whole = load_cluster(base.inventory)
    shared = whole if base.hosts is None else whole.select(hosts=",".join(base.hosts))
    if base.hosts is not None and base.nodes is not None and base.nodes > len(shared.nodes):
        raise InventoryError(
            f"--nodes {base.nodes}: --hosts names {len(shared.nodes)} node(s) "
            f"({', '.join(shared.names)}), and each trial of the sweep takes --nodes of "
            f"them; use --nodes {len(shared.nodes)} or fewer, or name more hosts")
    first = shared if base.nodes is None else shared.select(nodes=base.nodes)
    choose_nodes(replace(base, hosts=tuple(first.names), nodes=None))


def nodes_per_trial(base: RunSpec) -> tuple[list[str] | None, int]:
    """Where trials run without the queue: the nodes to share out (None: Slurm decides)
    and how many each trial takes."""
    if base.queue:
        return None, base.nodes or 1
    pool = [str(n) for n in (base.hosts or load_cluster(base.inventory).names)]
    return pool, min(base.nodes or len(pool), len(pool))


def default_parallel(base: RunSpec, trials: int) -> int:
    """As many trials at once as fit: every node's share without the queue, up to
    QUEUE_PARALLEL asking Slurm at once through it."""
    pool, each = nodes_per_trial(base)
    fit = len(pool) // each if pool is not None else QUEUE_PARALLEL
    return max(1, min(trials, fit))


class Sweep:
    """One pass over the sweep's pending trials (run), from the record it keeps current."""

    def __init__(self, record: SweepRecord, base: RunSpec,
                 say: Callable[[str], None] | None = None) -> None:
        self.record, self.base = record, base
        self.pool, self.each = nodes_per_trial(base)
        self.free = list(self.pool or [])
        self.running: list[Running] = []
        self.live = Live(record, say)
        self.missing_metric: dict[int, list[str]] = {}   # trial -> the keys it printed
        self.looked = 0.0   # when the running trials' losses were read last
        self.curves: dict[int, early.Curve] = {}   # each trial's (step, loss), as last read
        self.early: dict[int, str] = {}   # the trials early_stop stopped: why

    # -- the pass ----------------------------------------------------------------------------
    def run(self) -> int:
        """Run the pending trials; the sweep's exit status (0: every trial succeeded, 130:
        interrupted)."""
        record = self.record
        record.state, record.why = "running", ""
        record.host, record.pid = socket.gethostname(), os.getpid()
        record.save()
        if record.early_stop:   # resumed: the trials that ran before count as others
            for t in record.trials:
                if t.run_id and t.state.done:
                    self.curves[t.number] = early.curve(
                        read_timeline(RunDir(record.runs_dir, t.run_id)))
        self.live.begin()
        interrupted = False
        try:
            with hangup_interrupts():   # a closed terminal, SIGTERM: as Ctrl-C
                self._loop()
        except KeyboardInterrupt as exc:
            interrupted = True
            record.state, record.why = "stopped", str(exc) or "Ctrl-C"
        except BaseException as exc:   # the sweep's own fault: its trials stop with it
            record.state, record.why = "failed", f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._end_running()
            for t in record.trials:
                if t.state == TrialState.PENDING:
                    t.state = TrialState.NOT_RUN
            if record.state == "running":
                record.state = "ended"
            record.save()
            self.live.draw()
            write_sweep_report(record)
        self._say_missing_metric()
        if interrupted:
            return 130
        return 0 if all(t.state.finished for t in record.trials) else 1

    def _loop(self) -> None:
        record = self.record
        while True:
            self._reap()
            if record.stop_requested:
                record.state, record.why = "stopped", "`sweep stop`"
                return
            self._stop_for_failures()
            self._start_what_fits()
            if not self.running:
                return
            time.sleep(POLL_S)

    def _stop_for_failures(self) -> None:
        """max_failures trials failed: no more are started (the running ones end on their
        own)."""
        record = self.record
        failed = sum(t.state == TrialState.FAILED for t in record.trials)
        pending = [t for t in record.trials if t.state == TrialState.PENDING]
        if not (record.max_failures and failed >= record.max_failures and pending):
            return
        for t in pending:
            t.state = TrialState.NOT_RUN
        record.state = "failed"
        record.why = (f"{failed} trials failed (max_failures: {record.max_failures}): the "
                      f"other {len(pending)} were not started")
        record.save()
        self.live.note(record.why)

    def _start_what_fits(self) -> None:
        pending = [t for t in self.record.trials if t.state == TrialState.PENDING]
        while pending and len(self.running) < self.record.parallel and \
                (self.pool is None or len(self.free) >= self.each):
            trial = pending.pop(0)
            hosts = None
            if self.pool is not None:
                hosts, self.free = self.free[:self.each], self.free[self.each:]
            self._start(trial, hosts)

    def _start(self, trial: TrialRecord, hosts: list[str] | None) -> None:
        spec = trial_spec(self.base, self.record, trial, hosts)
        job = self.record.path / f"t{trial.number}.yaml"
        with open_private(job, "w") as fh:
            fh.write(spec.to_yaml())
        log = open_private(self.record.path / f"t{trial.number}.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "train", "-f", str(job)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        trial.run_id, trial.tries = spec.run_id, trial.tries + 1
        trial.state, trial.nodes = TrialState.RUNNING, list(hosts or [])
        trial.started, trial.ended, trial.metric, trial.why = time.time(), None, None, ""
        self.running.append(Running(trial, proc, log))
        self.record.save()
        self.live.changed(trial)

    def _reap(self) -> None:
        for r in list(self.running):
            if r.proc.poll() is None:
                if not r.trial.nodes and r.trial.run_id:   # through the queue: where it runs
                    r.trial.nodes = _nodes_of(RunDir(self.record.runs_dir, r.trial.run_id))
                continue
            self._ended(r)
        if self.running and time.monotonic() - self.looked >= LOSS_EVERY_S:
            self.looked = time.monotonic()
            for r in self.running:
                self._read(r.trial)
            self._stop_early()
            self.record.save()
            self.live.draw()   # on a terminal: the losses so far, the durations

    def _read(self, trial: TrialRecord) -> None:
        """TRIAL's losses so far, from its run's timeline."""
        points = read_timeline(RunDir(self.record.runs_dir, trial.run_id or ""))
        losses = [p.loss for p in points if p.loss is not None]
        trial.loss = losses[-1] if losses else None
        self.curves[trial.number] = early.curve(points)

    def _stop_early(self) -> None:
        """early_stop: each running trial worse than the others at its step gets one
        Ctrl-C (its run stops on every node) and ends as `stopped early`."""
        rule = self.record.early_stop
        if rule is None:
            return
        running = {r.trial.number: self.curves.get(r.trial.number, [])
                   for r in self.running if r.trial.number not in self.early}
        for number, why in early.judge(rule, running, self.curves).items():
            self.early[number] = why
            r = next(r for r in self.running if r.trial.number == number)
            self.live.note(f"t{number}: {why}")
            with contextlib.suppress(ProcessLookupError):
                r.proc.send_signal(signal.SIGINT)

    def _ended(self, r: Running) -> None:
        r.log.close()
        self.running.remove(r)
        trial = r.trial
        if self.pool is not None:
            self.free += [n for n in trial.nodes if n in self.pool]
            self.free.sort(key=self.pool.index)
        trial.ended = time.time()
        run = RunDir(self.record.runs_dir, trial.run_id or "")
        summary = run.summary() if run.run_json.exists() else None
        if summary is None:   # refused before its run began: its own words say why
            trial.state = TrialState.FAILED
            trial.why = _last_line(self.record.path / f"t{trial.number}.log")
        else:
            trial.state = TrialState.of_run(summary.status)
            trial.nodes = trial.nodes or _nodes_of(run)
            trial.why = "" if trial.state == TrialState.SUCCEEDED else \
                (summary.error or "")
            metrics = final_metrics(run, _nodes_of(run)) or {}
            self._read(trial)
            value = metrics.get(self.record.metric)
            if value is None and self.record.metric == "loss":   # its last beat's
                value = trial.loss
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                trial.metric = float(value)
            elif trial.state == TrialState.SUCCEEDED:
                self.missing_metric[trial.number] = sorted(metrics)
        if trial.number in self.early and trial.state != TrialState.SUCCEEDED:
            trial.state, trial.why = TrialState.EARLY, self.early[trial.number]
        self.record.save()
        self.live.changed(trial)
        write_sweep_report(self.record)

    def _end_running(self) -> None:
        """The trials still running when the sweep ends (Ctrl-C, `sweep stop`, its own
        fault) are given one Ctrl-C each (their runs stop on every node; a run `sweep stop`
        stopped already is ending anyway), and waited for, up to STOP_WAIT_S."""
        for r in self.running:
            if r.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    r.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + STOP_WAIT_S
        for r in list(self.running):
            try:
                r.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
            self._ended(r)

    def _say_missing_metric(self) -> None:
        if not self.missing_metric:
            return
        keys = sorted({k for ks in self.missing_metric.values() for k in ks})
        trials = ", ".join(f"t{n}" for n in sorted(self.missing_metric))
        self.live.note(f"the metric {self.record.metric!r} was not in the FINAL_METRICS of "
                       f"{trials}: " + (f"they printed {', '.join(keys)}; set metric: to one "
                                        "of them" if keys else "they printed no FINAL_METRICS "
                                        "line (print `FINAL_METRICS {json}` at the end)"))


def _nodes_of(run: RunDir) -> list[str]:
    """The nodes RUN runs on ([] before its record says: waiting in the queue)."""
    if not run.run_json.exists():
        return []
    try:
        return list(run.info().get("nodes") or [])
    except (OSError, ValueError, ClusterError):
        return []


def _last_line(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(encoding="utf-8", errors="replace").splitlines()
                 if x.strip()]
    except OSError:
        return ""
    errors = [x for x in lines if x.startswith("error:")]
    return (errors or lines or [""])[-1]
