"""`sweep -f FILE`, `sweep show|stop|resume ID`: many runs of one job, each with its own
parameters (orchestrator/sweep/: the file, the runner, the record, the table)."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from .. import defaults
from ..errors import ClusterError, InputError
from ..record.rundir import open_private, write_private
from ..run.spec import Given, RunSpec, from_sources, read_job_file
from ..run.stop import stop_run
from ..sweep.liveness import alive, settle
from ..sweep.record import STOP, SweepRecord, TrialState, new_sweep, open_sweep
from ..sweep.report import REPORT
from ..sweep.runner import Sweep, check_nodes, default_parallel
from ..sweep.sweepfile import read_sweep_file
from ..sweep.table import table
from . import values

JOB = "job.yaml"   # in the sweep's directory: the job every trial runs (resume reads it)
LOG = "sweep.log"  # in the sweep's directory: a detached sweep's own output
DETACH_WAIT_S = 20.0   # a detached sweep says it runs within this, or its log is shown


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="many runs of one job, each with its own parameters",
                       description="A sweep file is a job file (train -f) with a sweep: "
                       "section (method grid or random, the script's parameters, the metric "
                       "to rank by): each trial is an ordinary run of the job with its "
                       "parameters after the script's arguments, as many at once as fit "
                       "(through Slurm's queue with queue: true). docs/sweeps.md has it all.")
    p.add_argument("-f", "--file", metavar="SWEEP_FILE", help="run the sweep this file says")
    values.add_runs_dir(p, None, "where the sweep and its trials are recorded (default: "
                        f"the job's runs_dir, or {defaults.RUNS_DIR})")
    values.add_inventory(p, None, "the inventory (default: the job's)")
    p.add_argument("--detach", action="store_true", help=DETACH_HELP)
    p.set_defaults(func=_run)
    verbs = p.add_subparsers(dest="action", metavar="ACTION")
    for name, what in (("show", "its trials, best first by the metric"),
                       ("stop", "stop its running trials and start no more"),
                       ("resume", "run again every trial not succeeded (nor stopped early)")):
        v = verbs.add_parser(name, help=what, description=f"sweep {name} ID: {what}.")
        v.add_argument("sweep", metavar="ID", help="the sweep's id (printed first)")
        values.add_runs_dir(v)
        if name == "show":
            v.add_argument("--json", action="store_true", help="the record as JSON")
        if name == "resume":
            v.add_argument("--detach", action="store_true", help=DETACH_HELP)
        v.set_defaults(func={"show": _show, "stop": _stop, "resume": _resume}[name])


def _run(args: argparse.Namespace) -> int:
    if not args.file:
        raise InputError("sweep needs a sweep file: python -m orchestrator sweep -f "
                         "sweep.yaml (or: sweep show|stop|resume ID); docs/sweeps.md")
    path = Path(args.file)
    given, sweep = read_sweep_file(path)
    if args.runs_dir:
        given["runs_dir"] = Given(args.runs_dir, "--runs-dir")
    if args.inventory:
        given["inventory"] = Given(args.inventory, "-i/--inventory")
    base = _absolute(from_sources(given))
    for key, fix in (("detach", "a sweep follows its trials to their end: take detach out"),
                     ("run_id", "the sweep names its trials' runs: take run_id out")):
        if getattr(base, key):
            raise InputError(f"{path}: {key}: {fix}")
    check_nodes(base)   # before the record: a sweep train would refuse is none
    trials = sweep.expand()
    parallel = sweep.parallel or default_parallel(base, len(trials))
    record = new_sweep(base.runs_dir, path.absolute(), sweep, trials, parallel)
    write_private(record.path / JOB, base.to_yaml())   # its owner's only, as the record
    if args.detach:
        return _detach(record)
    return _conclude(record, Sweep(record, base).run())


DETACH_HELP = ("run the sweep in the background on this machine (its output in "
               "RUNS/ID/sweep.log): the terminal may close; `sweep show ID` follows it, "
               "`sweep stop ID` stops it")


def _detach(record: SweepRecord) -> int:
    """Hand RECORD's pending trials to a process of their own on this machine, in a
    session of its own (a closed terminal does not stop it), as `sweep resume` runs them;
    back once it said it runs (or ended already: then its log says why)."""
    log = open_private(record.path / LOG, "ab")
    argv = [sys.executable, "-m", "orchestrator", "sweep", "resume", record.sweep_id,
            "--runs-dir", str(record.runs_dir)]
    with log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + DETACH_WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if open_sweep(record.runs_dir, record.sweep_id).pid == proc.pid:
            break
        time.sleep(0.2)
    where = _runs_dir_option(record)
    if proc.poll() not in (None, 0):
        tail = (record.path / LOG).read_text(encoding="utf-8", errors="replace")
        print(tail[-3000:], end="", file=sys.stderr)
        print(f"sweep {record.sweep_id}: its detached process ended at once (exit "
              f"{proc.returncode}; above, from {record.path / LOG})", file=sys.stderr)
        return proc.returncode or 1
    print(f"sweep {record.sweep_id}: detached (process {proc.pid} on "
          f"{socket.gethostname()}; its output: {record.path / LOG}); follow it: python -m "
          f"orchestrator sweep show {record.sweep_id}{where}; stop it: python -m "
          f"orchestrator sweep stop {record.sweep_id}{where}", flush=True)
    return 0


def _absolute(spec: RunSpec) -> RunSpec:
    """SPEC with its paths absolute: each trial's job file lies in the sweep's directory,
    and a job file's relative paths are taken from where it lies."""
    return replace(spec, runs_dir=spec.runs_dir.absolute(),
                   inventory=Path(spec.inventory).absolute(),
                   workdir=spec.workdir.absolute() if spec.workdir else None)


def _conclude(record: SweepRecord, code: int) -> int:
    for line in table(record, ranked=True):
        print(line)
    best = record.ranked()[0] if record.trials else None
    said = record.tally()
    print(f"sweep {record.sweep_id}: {record.state}"
          + (f" ({record.why})" if record.why else "") + f": {said}"
          + (f"; best t{best.number} ({' '.join(best.args)}): {record.metric} "
             f"{best.metric:.6g}" if best and best.metric is not None else "")
          + f"; python -m orchestrator sweep show {record.sweep_id}"
          + _runs_dir_option(record)
          + f"; its report: {record.path / REPORT}", flush=True)
    return code


def _runs_dir_option(record: SweepRecord) -> str:
    """` --runs-dir DIR` for the commands a sweep's lines suggest, unless DIR is the default."""
    return ("" if record.runs_dir == Path(defaults.RUNS_DIR).absolute()
            else f" --runs-dir {record.runs_dir}")


def _show(args: argparse.Namespace) -> int:
    record = settle(open_sweep(Path(args.runs_dir), args.sweep))
    if args.json:
        print(json.dumps({"sweep_id": record.sweep_id, "state": record.state,
                          "why": record.why, "metric": record.metric, "goal": record.goal,
                          "trials": [t.to_json() for t in record.ranked()]}, indent=1))
        return 0
    print(f"sweep {record.sweep_id}: {record.state}" + (f" ({record.why})" if record.why
                                                         else "") + f"; from {record.file}")
    for line in table(record, ranked=True):
        print(line)
    if (record.path / REPORT).exists():
        print(f"its report: {record.path / REPORT}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    record = open_sweep(Path(args.runs_dir), args.sweep)
    (record.path / STOP).touch()
    running = [t for t in record.trials if t.state == TrialState.RUNNING and t.run_id]
    for t in running:
        try:
            results = stop_run(record.runs_dir, t.run_id or "")
        except (OSError, ClusterError, InputError) as exc:
            print(f"t{t.number} (run {t.run_id}): {exc}")
            continue
        print(f"t{t.number} (run {t.run_id}): " + (
            "stopped on " + ", ".join(r.node for r in results) if results
            else "cancelled in Slurm's queue"))
    print(f"sweep {record.sweep_id}: stop asked; " + (
        "it starts no more trials" if alive(record) else "it was not running"))
    settle(record)
    return 0


def _resume(args: argparse.Namespace) -> int:
    record = settle(open_sweep(Path(args.runs_dir), args.sweep))
    if alive(record):
        raise InputError(f"sweep {record.sweep_id} is running (process {record.pid}); stop it "
                         f"first: python -m orchestrator sweep stop {record.sweep_id}")
    still = [t for t in record.trials if t.state == TrialState.RUNNING]
    if still:
        raise InputError(f"sweep {record.sweep_id}: the run of "
                         + ", ".join(f"t{t.number} ({t.run_id})" for t in still)
                         + " has not ended (the sweep's process is gone, its trials' are "
                         "not): let it end, or stop it (python -m orchestrator stop RUN), "
                         "then resume")
    again = [t for t in record.trials if not t.state.finished]
    if not again:
        print(f"sweep {record.sweep_id}: every trial succeeded (or was stopped early); "
              "nothing to run")
        return 0
    base = from_sources(read_job_file(record.path / JOB, RunSpec))
    check_nodes(base)   # the inventory may have changed since
    (record.path / STOP).unlink(missing_ok=True)
    for t in again:
        t.state = TrialState.PENDING
    if args.detach:
        record.state, record.why = "starting", ""
        record.save()
        return _detach(record)
    return _conclude(record, Sweep(record, base).run())
