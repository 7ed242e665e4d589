"""Every program that runs on a node, by verb: `python3 LIB/node.py VERB ...` on a node
(LIB: ~/.clustertrain/lib/<version>, see orchestrator/cluster/nodelib.py), or
`python -m orchestrator.node VERB ...` in a checkout.

  supervise  start torchrun for a run and watch over it (supervise.py)
  follow     print a run's output as it grows, ending with the exit marker (follow.py)
  stop       stop a run's processes on this node (stop.py)
  dump       every worker's stack and flight recorder, as JSON (dump.py)
  probe      preflight's round 1: this node as it is now (probe.py; request on stdin)
  reach      preflight's round 2: node 0's token and master port (probe.py)
  unlisten   end node 0's preflight listener (probe.py)
  release    drop the master-port claim of a run (probe.py)
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
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .protocol import GO, GRACE, KEEP_RUNS, LEASE_TIMEOUT, READY


@dataclass(frozen=True)
class Verb:
    """A node program: its arguments (added to its subcommand's parser) and what it does
    (its exit status). Each imports its module when it runs, not before: a program's start
    loads only what it needs."""
    arguments: Callable[[argparse.ArgumentParser], None]
    handle: Callable[[argparse.Namespace], int]


def _no_arguments(p: argparse.ArgumentParser) -> None:
    pass


def _print_json(value: object) -> int:
    print(json.dumps(value))
    return 0


def _job(args: argparse.Namespace) -> str:
    """The job directory of `stop` and `dump` (JOBS is relative to the user's home)."""
    return os.path.join(os.path.expanduser("~"), args.jobs, args.run)


# -- supervise, standby, recovery-plan ---------------------------------------------------
def _supervise_arguments(r: argparse.ArgumentParser) -> None:
    for name in ("--job", "--state-dir", "--run", "--node", "--nodes"):
        r.add_argument(name, required=True)
    r.add_argument("--addresses", help="each node's cluster address, in --nodes' order "
                   "(the ring's beats go there; default: the nodes' names)")
    r.add_argument("--grace", type=float, default=GRACE)
    r.add_argument("--lease-timeout", type=float, default=LEASE_TIMEOUT)
    r.add_argument("--attached", action="store_true")
    r.add_argument("--hang-timeout", type=float, default=0.0,
                   help="seconds without progress on every node after which the run is "
                   "hung (0: never)")
    r.add_argument("--on-hang", choices=("stop", "wait"), default="stop")
    r.add_argument("--keep", type=int, default=KEEP_RUNS,
                   help="prune all but the KEEP newest runs' snapshots and job dirs")
    r.add_argument("--cwd", help="torchrun's working directory (the run's code snapshot)")
    r.add_argument("--wait-go", action="store_true",
                   help=f"say {READY}, start on {GO!r} (on stdin: it brings the ring's "
                   "key), then detach")
    r.add_argument("--in-step", action="store_true",
                   help="run as a step of the run's Slurm job (srun): after GO, go on in "
                   "the foreground instead of detaching; SIGTERM (Slurm ends the job) "
                   "ends the run here")
    r.add_argument("--key-file", help="without --wait-go: the run's ring key (hex)")
    r.add_argument("--ring-ports", help="LOW-HIGH: the ring's UDP port is the first "
                   "free one of these (the cluster's ring ports)")
    r.add_argument("--recovery", action="store_true",
                   help="a detached run that may recover: a peer's fault starts the next "
                   "attempt (recover.py; the plan is in STATE/recovery/)")
    r.add_argument("argv", nargs=argparse.REMAINDER)


def _supervise(args: argparse.Namespace) -> int:
    from . import supervise
    if args.argv and args.argv[0] == "--":
        args.argv = args.argv[1:]
    return supervise.run(args)


def _standby_arguments(sb: argparse.ArgumentParser) -> None:
    sb.add_argument("--plan", required=True, help="the run's recovery plan on the share")
    sb.add_argument("--node", required=True, help="this spare's inventory name")
    sb.add_argument("--torchrun", required=True, help="this node's torchrun")
    sb.add_argument("--log", required=True, help="the standby's own words")
    sb.add_argument("--detach", action="store_true", help="go on in a session of its own")


def _standby(args: argparse.Namespace) -> int:
    from .recover import standby
    return standby(args)


def _recovery_plan_arguments(pl: argparse.ArgumentParser) -> None:
    pl.add_argument("path", help="where the plan (JSON on stdin) goes")


def _recovery_plan(args: argparse.Namespace) -> int:
    from .util import write_json
    os.makedirs(os.path.dirname(args.path), exist_ok=True)
    write_json(args.path, json.load(sys.stdin))
    return 0


# -- follow, stop, dump -------------------------------------------------------------------
def _follow_arguments(f: argparse.ArgumentParser) -> None:
    f.add_argument("--job", required=True)
    start = f.add_mutually_exclusive_group()
    start.add_argument("--tail", type=int)
    start.add_argument("--from-line", type=int, default=0)
    f.add_argument("--lease", action="store_true")


def _follow(args: argparse.Namespace) -> int:
    from . import follow
    code = follow.follow(args)
    sys.stdout.flush()
    os._exit(code)  # the lease thread may be blocked reading stdin: do not wait for it


def _stop_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("jobs")      # the jobs directory, relative to the user's home
    s.add_argument("run")
    s.add_argument("grace", type=float)


def _stop(args: argparse.Namespace) -> int:
    from .stop import stop_tree
    return _print_json(stop_tree(_job(args), args.run, args.grace))


def _dump_arguments(d: argparse.ArgumentParser) -> None:
    d.add_argument("jobs")      # the jobs directory, relative to the user's home
    d.add_argument("run")
    d.add_argument("py_spy")
    d.add_argument("--native", action="store_true")


def _dump(args: argparse.Namespace) -> int:
    from .dump import dump_workers
    return _print_json({"ranks": dump_workers(_job(args), args.run, args.py_spy, args.native)})


# -- preflight: probe, reach, unlisten, release ------------------------------------------
def _probe(args: argparse.Namespace) -> int:
    from .probe import probe
    return _print_json(probe(json.load(sys.stdin)))


def _reach(args: argparse.Namespace) -> int:
    from .probe import reach
    return _print_json(reach(json.load(sys.stdin)))


def _unlisten_arguments(u: argparse.ArgumentParser) -> None:
    u.add_argument("port", type=int)
    u.add_argument("nonce")


def _unlisten(args: argparse.Namespace) -> int:
    from .probe import stop_listener
    stop_listener(args.port, args.nonce)
    return 0


def _release_arguments(rel: argparse.ArgumentParser) -> None:
    rel.add_argument("run")
    rel.add_argument("--once-bound", type=int, metavar="PORT",
                     help="first wait until PORT is bound (at most BOUND_WAIT seconds)")


def _release(args: argparse.Namespace) -> int:
    from .probe import release
    release(args.run, once_bound=args.once_bound)
    return 0


# -- the node's own: busy, envs, allocate, states, cordon, du, usage, torch, carry -----------------
def _busy_arguments(b: argparse.ArgumentParser) -> None:
    b.add_argument("--exclude", metavar="RUN", help="leave this run out (the one launched)")


def _busy(args: argparse.Namespace) -> int:
    from .busy import scan
    return _print_json(scan(exclude=args.exclude).to_json())


def _envs_arguments(ev: argparse.ArgumentParser) -> None:
    ev.add_argument("--name", help="only this environment's states")
    ev.add_argument("--rm", action="store_true", help="remove them (none while in use)")
    ev.add_argument("--key", help="with --rm: only this state")
    ev.add_argument("--prune", type=int, metavar="KEEP",
                    help="remove the states of --name beyond the KEEP newest (unused ones)")


def _envs(args: argparse.Namespace) -> int:
    from . import envs
    if args.name and args.prune is not None:
        return _print_json(envs.prune(args.name, args.prune))
    return _print_json(envs.remove(args.name, args.key) if args.rm and args.name
                       else envs.list_envs(args.name))


def _allocate_arguments(al: argparse.ArgumentParser) -> None:
    al.add_argument("--name", required=True, help="the Slurm job's name")
    al.add_argument("--gpus-per-node", default="all", help="G, or all (the default)")
    al.add_argument("salloc", nargs=argparse.REMAINDER, help="-- salloc's options")


def _allocate(args: argparse.Namespace) -> int:
    from .allocate import main as allocate
    return allocate(args.name, args.gpus_per_node,
                    args.salloc[1:] if args.salloc[:1] == ["--"] else args.salloc)


def _states_arguments(st: argparse.ArgumentParser) -> None:
    st.add_argument("state_dir")


def _states(args: argparse.Namespace) -> int:
    from .states import read_states
    return _print_json(read_states(args.state_dir))


def _cordon(args: argparse.Namespace) -> int:
    from .cordon import main as cordon
    return _print_json(cordon(json.load(sys.stdin)))


def _health_arguments(h: argparse.ArgumentParser) -> None:
    h.add_argument("--share", help="read every node's history and cordons there too")
    h.add_argument("--since", type=float, default=0.0, help="seconds since the epoch")
    h.add_argument("--admin-group", default=None)


def _health(args: argparse.Namespace) -> int:
    from .health import nodes_view, read_state
    out: dict[str, object] = {"state": read_state()}
    if args.share:
        out.update(nodes_view(args.share, args.since, args.admin_group))
    return _print_json(out)


def _du_arguments(d: argparse.ArgumentParser) -> None:
    d.add_argument("share")


def _du(args: argparse.Namespace) -> int:
    from .du import usage
    return _print_json(usage(args.share))


def _usage_arguments(u: argparse.ArgumentParser) -> None:
    u.add_argument("share")
    u.add_argument("--since", type=float, default=0.0, help="seconds since the epoch")
    u.add_argument("--sacct", action="store_true", help="Slurm's accounting too (sacct.py)")


def _usage(args: argparse.Namespace) -> int:
    import time

    from .usage import usage
    found = usage(args.share, args.since)
    if args.sacct:
        from .sacct import slurm_usage
        found["slurm"] = slurm_usage(args.since, time.time())
    return _print_json(found)


def _torch(args: argparse.Namespace) -> int:
    from .fingerprint import checks
    return _print_json(checks())


def _carry_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("code_root")   # ~/.clustertrain/code
    c.add_argument("run")
    c.add_argument("key")         # the work directory's (its digest)


def _carry(args: argparse.Namespace) -> int:
    from .carry import main as carry
    return carry(args.code_root, args.run, args.key)


# Every verb but `worker` (its script's own arguments follow: main hands them on unparsed).
VERBS: dict[str, Verb] = {
    "supervise": Verb(_supervise_arguments, _supervise),
    "standby": Verb(_standby_arguments, _standby),
    "recovery-plan": Verb(_recovery_plan_arguments, _recovery_plan),
    "follow": Verb(_follow_arguments, _follow),
    "stop": Verb(_stop_arguments, _stop),
    "dump": Verb(_dump_arguments, _dump),
    "probe": Verb(_no_arguments, _probe),
    "reach": Verb(_no_arguments, _reach),
    "unlisten": Verb(_unlisten_arguments, _unlisten),
    "release": Verb(_release_arguments, _release),
    "busy": Verb(_busy_arguments, _busy),
    "envs": Verb(_envs_arguments, _envs),
    "allocate": Verb(_allocate_arguments, _allocate),
    "states": Verb(_states_arguments, _states),
    "cordon": Verb(_no_arguments, _cordon),
    "du": Verb(_du_arguments, _du),
    "health": Verb(_health_arguments, _health),
    "usage": Verb(_usage_arguments, _usage),
    "torch": Verb(_no_arguments, _torch),
    "carry": Verb(_carry_arguments, _carry),
}


def _parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The node programs' arguments; with VERB, that verb's alone (all of them if it is
    none): each program's start (the launch's, on every node at once) builds one
    subcommand's parser, not seventeen, whose messages' translations are looked up on disk."""
    if verb is not None and verb not in VERBS:
        verb = None   # no such verb: argparse names the ones there are
    p = argparse.ArgumentParser(prog="node.py", allow_abbrev=False)
    sub = p.add_subparsers(dest="verb", required=True)
    for name, spec in VERBS.items():
        if verb is None or verb == name:
            spec.arguments(sub.add_parser(name, allow_abbrev=False))
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:  # the script's own arguments follow: not ours to parse
        from . import worker
        worker.main(argv[1:])
        return 0  # not reached: the worker leaves with os._exit
    args = _parser(argv[0] if argv else None).parse_args(argv)
    return VERBS[args.verb].handle(args)


if __name__ == "__main__":
    sys.exit(main())
