"""Every program that runs on a node, by verb: `python3 LIB/node.py VERB ...` on a node
(LIB: ~/.clustertrain/lib/<version>, see orchestrator/cluster/nodelib.py), or
`python -m orchestrator.node VERB ...` in a checkout.

  supervise  start torchrun for a run and watch over it (supervise.py)
  follow     print a run's output as it grows, ending with the exit marker (follow.py)
  stop       stop a run's processes on this node (terminate.py)
  dump       every worker's stack and flight recorder, as JSON (dump.py)
  probe      preflight's round 1: this node as it is now (preflight.py; request on stdin)
  reach      preflight's round 2: node 0's token and master port (preflight.py)
  unlisten   end node 0's preflight listener (preflight.py)
  release    drop the master-port claim of a run (preflight.py)
  allocate   hold a Slurm allocation while the controller's connection lives (allocate.py)
  busy       this node's live runs (any user's) and GPU processes, as JSON (busy.py)
  envs       the user's own environments here, as JSON; --rm and --prune remove (envs.py)
  states     the run's node states, hang dumps and recovery decision on the share
  standby    a spare of a detached run that may recover: waits for its place (recover.py)
  recovery-plan  write a detached run's recovery plan on the share (JSON on stdin)
  cordon     add a node's cordon or uncordon to the share's record, or list (cordon.py)
  du         the share's bytes by owner and kind, as JSON (du.py)
  health     this node's health verdict; with --share, every node's history (health.py)
  usage      node- and GPU-hours per user and run from the records on the share (usage.py)
  torch      import torch in this Python and say what it sees (fingerprint.py)
  carry      what a job wrote in its working directory, into the next run's (carry.py)
  worker     run one training worker to a clean end (worker.py; torchrun starts it)
  torchrun   torch's torchrun, its agents leaving the end together (torchrun.py)

A verb that answers prints its answer, the dataclass its request names (requests.py
ANSWER, answers.py), as one JSON object on the last line of its output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import answers as an, requests as rq


@dataclass(frozen=True)
class Verb:
    """A node program: its request (its arguments, declared once: requests.py) and what it
    does with it (its exit status). Each imports its module when it runs, not before: a
    program's start loads only what it needs."""
    request: type[rq.Request]
    handle: Callable[[Any], int]


def _answer(answer: an.Answer) -> int:
    """Print ANSWER, the verb's, as the last line of its output (answers.py)."""
    print(json.dumps(answer.to_json()))
    return 0


def _job(jobs: str, run: str) -> str:
    """The job directory of `stop` and `dump` (JOBS is relative to the user's home)."""
    return os.path.join(os.path.expanduser("~"), jobs, run)


# -- supervise, standby, recovery-plan ---------------------------------------------------
def _supervise(r: rq.Supervise) -> int:
    from . import supervise
    return supervise.run(r)


def _standby(r: rq.Standby) -> int:
    from .recover import standby
    return standby(r)


def _recovery_plan(r: rq.RecoveryPlan) -> int:
    from .util import write_json
    os.makedirs(os.path.dirname(r.path), exist_ok=True)
    write_json(r.path, json.load(sys.stdin))
    return 0


# -- follow, stop, dump -------------------------------------------------------------------
def _follow(r: rq.Follow) -> int:
    from . import follow
    code = follow.follow(r)
    sys.stdout.flush()
    os._exit(code)  # the lease thread may be blocked reading stdin: do not wait for it


def _stop(r: rq.Stop) -> int:
    from .terminate import stop_tree
    return _answer(an.StopAnswer.from_json(stop_tree(_job(r.jobs, r.run), r.run, r.grace)))


def _dump(r: rq.Dump) -> int:
    from .dump import dump_workers
    return _answer(an.DumpAnswer.from_json(
        {"ranks": dump_workers(_job(r.jobs, r.run), r.run, r.py_spy, r.native)}))


# -- preflight: probe, reach, unlisten, release ------------------------------------------
def _probe(r: rq.Probe) -> int:
    from .preflight import probe
    return _answer(an.ProbeAnswer.from_json(probe(json.load(sys.stdin))))


def _reach(r: rq.Reach) -> int:
    from .preflight import reach
    return _answer(an.ReachAnswer.from_json(reach(json.load(sys.stdin))))


def _unlisten(r: rq.Unlisten) -> int:
    from .preflight import stop_listener
    stop_listener(r.port, r.nonce)
    return 0


def _release(r: rq.Release) -> int:
    from .preflight import release
    release(r.run, once_bound=r.once_bound)
    return 0


# -- the node's own: busy, envs, allocate, states, cordon, du, usage, torch, carry -----------------
def _busy(r: rq.Busy) -> int:
    from .busy import scan
    return _answer(scan(exclude=r.exclude))


def _envs(r: rq.Envs) -> int:
    from . import envs
    if r.name and r.prune is not None:
        return _answer(an.EnvsAnswer.from_json(envs.prune(r.name, r.prune)))
    return _answer(an.EnvsAnswer.from_json(envs.remove(r.name, r.key) if r.rm and r.name
                                           else envs.list_envs(r.name)))


def _allocate(r: rq.Allocate) -> int:
    from .allocate import main as allocate
    return allocate(r.name, r.gpus_per_node, list(r.rest))


def _states(r: rq.States) -> int:
    from .states import read_states
    return _answer(an.StatesAnswer.from_json(read_states(r.state_dir)))


def _cordon(r: rq.Cordon) -> int:
    from .cordon import main as cordon
    return _answer(an.CordonAnswer.from_json(cordon(json.load(sys.stdin))))


def _health(r: rq.Health) -> int:
    from .health import nodes_view, read_state
    out: dict[str, object] = {"state": read_state()}
    if r.share:
        out.update(nodes_view(r.share, r.since, r.admin_group))
    return _answer(an.HealthAnswer.from_json(out))


def _du(r: rq.Du) -> int:
    from .du import usage
    return _answer(an.DuAnswer.from_json(usage(r.share)))


def _usage(r: rq.Usage) -> int:
    import time

    from .usage import usage
    found = usage(r.share, r.since)
    if r.sacct:
        from .sacct import slurm_usage
        found["slurm"] = slurm_usage(r.since, time.time())
    return _answer(an.UsageAnswer.from_json(found))


def _torch(r: rq.Torch) -> int:
    from .fingerprint import checks
    return _answer(an.TorchAnswer.from_json(checks()))


def _carry(r: rq.Carry) -> int:
    from .carry import carry
    return _answer(an.CarryAnswer.from_json(
        carry(os.path.expanduser(r.code_root), r.run, r.key)))


# Every verb but `worker` and `torchrun` (the script's or torchrun's own arguments follow:
# main hands them on unparsed).
VERBS: dict[str, Verb] = {v.request.VERB: v for v in (
    Verb(rq.Supervise, _supervise), Verb(rq.Standby, _standby),
    Verb(rq.RecoveryPlan, _recovery_plan), Verb(rq.Follow, _follow), Verb(rq.Stop, _stop),
    Verb(rq.Dump, _dump), Verb(rq.Probe, _probe), Verb(rq.Reach, _reach),
    Verb(rq.Unlisten, _unlisten), Verb(rq.Release, _release), Verb(rq.Busy, _busy),
    Verb(rq.Envs, _envs), Verb(rq.Allocate, _allocate), Verb(rq.States, _states),
    Verb(rq.Cordon, _cordon), Verb(rq.Du, _du), Verb(rq.Health, _health),
    Verb(rq.Usage, _usage), Verb(rq.Torch, _torch), Verb(rq.Carry, _carry))}


def _parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The node programs' arguments; with VERB, that verb's alone (all of them if it is
    none): each program's start (the launch's, on every node at once) builds one
    subcommand's parser, not twenty, whose messages' translations are looked up on disk."""
    if verb is not None and verb not in VERBS:
        verb = None   # no such verb: argparse names the ones there are
    p = argparse.ArgumentParser(prog="node.py", allow_abbrev=False)
    sub = p.add_subparsers(dest="verb", required=True)
    for name, spec in VERBS.items():
        if verb is None or verb == name:
            spec.request.add_arguments(sub.add_parser(name, allow_abbrev=False))
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:  # the script's own arguments follow: not ours to parse
        from . import worker
        worker.main(argv[1:])
        return 0  # not reached: the worker leaves with os._exit
    if argv[:1] == ["torchrun"]:  # torchrun's own arguments: torch parses them
        from . import torchrun
        return torchrun.main(argv[1:])
    args = _parser(argv[0] if argv else None).parse_args(argv)
    spec = VERBS[args.verb]
    return spec.handle(spec.request.from_args(args))


if __name__ == "__main__":
    sys.exit(main())
