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
  torch      import torch in this Python and say what it sees (fingerprint.py)
  carry      what a job wrote in its working directory, into the next run's (carry.py)
  worker     run one training worker to a clean end (worker.py; torchrun starts it)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .protocol import GO, GRACE, KEEP_RUNS, LEASE_TIMEOUT, READY


def _parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The node programs' arguments; with VERB, that verb's alone (all of them if it is
    none): each program's start (the launch's, on every node at once) builds one
    subcommand's parser, not seventeen, whose messages' translations are looked up on disk."""
    p = argparse.ArgumentParser(prog="node.py", allow_abbrev=False)
    sub = p.add_subparsers(dest="verb", required=True)

    def want(name: str) -> bool:
        return verb is None or verb == name

    if want("supervise"):
        r = sub.add_parser("supervise", allow_abbrev=False)
        r.add_argument("--job", required=True)
        r.add_argument("--state-dir", required=True)
        r.add_argument("--run", required=True)
        r.add_argument("--node", required=True)
        r.add_argument("--nodes", required=True)
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
        r.add_argument("--key-file", help="without --wait-go: the run's ring key (hex)")
        r.add_argument("--ring-ports", help="LOW-HIGH: the ring's UDP port is the first "
                       "free one of these (the cluster's ring ports)")
        r.add_argument("--recovery", action="store_true",
                       help="a detached run that may recover: a peer's fault starts the next "
                       "attempt (recover.py; the plan is in STATE/recovery/)")
        r.add_argument("argv", nargs=argparse.REMAINDER)
    if want("standby"):
        sb = sub.add_parser("standby", allow_abbrev=False)
        sb.add_argument("--plan", required=True, help="the run's recovery plan on the share")
        sb.add_argument("--node", required=True, help="this spare's inventory name")
        sb.add_argument("--torchrun", required=True, help="this node's torchrun")
        sb.add_argument("--log", required=True, help="the standby's own words")
        sb.add_argument("--detach", action="store_true", help="go on in a session of its own")
    if want("recovery-plan"):
        pl = sub.add_parser("recovery-plan", allow_abbrev=False)
        pl.add_argument("path", help="where the plan (JSON on stdin) goes")
    if want("follow"):
        f = sub.add_parser("follow", allow_abbrev=False)
        f.add_argument("--job", required=True)
        start = f.add_mutually_exclusive_group()
        start.add_argument("--tail", type=int)
        start.add_argument("--from-line", type=int, default=0)
        f.add_argument("--lease", action="store_true")
    if want("stop"):
        s = sub.add_parser("stop", allow_abbrev=False)
        s.add_argument("jobs")      # the jobs directory, relative to the user's home
        s.add_argument("run")
        s.add_argument("grace", type=float)
    if want("dump"):
        d = sub.add_parser("dump", allow_abbrev=False)
        d.add_argument("jobs")      # the jobs directory, relative to the user's home
        d.add_argument("run")
        d.add_argument("py_spy")
        d.add_argument("--native", action="store_true")
    if want("probe"):
        sub.add_parser("probe", allow_abbrev=False)
    if want("reach"):
        sub.add_parser("reach", allow_abbrev=False)
    if want("unlisten"):
        u = sub.add_parser("unlisten", allow_abbrev=False)
        u.add_argument("port", type=int)
        u.add_argument("nonce")
    if want("release"):
        rel = sub.add_parser("release", allow_abbrev=False)
        rel.add_argument("run")
        rel.add_argument("--once-bound", type=int, metavar="PORT",
                         help="first wait until PORT is bound (at most BOUND_WAIT seconds)")
    if want("busy"):
        b = sub.add_parser("busy", allow_abbrev=False)
        b.add_argument("--exclude", metavar="RUN", help="leave this run out (the one launched)")
    if want("envs"):
        ev = sub.add_parser("envs", allow_abbrev=False)
        ev.add_argument("--name", help="only this environment's states")
        ev.add_argument("--rm", action="store_true", help="remove them (none while in use)")
        ev.add_argument("--key", help="with --rm: only this state")
        ev.add_argument("--prune", type=int, metavar="KEEP",
                        help="remove the states of --name beyond the KEEP newest (unused ones)")
    if want("allocate"):
        al = sub.add_parser("allocate", allow_abbrev=False)
        al.add_argument("--name", required=True, help="the Slurm job's name")
        al.add_argument("--gpus-per-node", default="all", help="G, or all (the default)")
        al.add_argument("salloc", nargs=argparse.REMAINDER, help="-- salloc's options")
    if want("states"):
        st = sub.add_parser("states", allow_abbrev=False)
        st.add_argument("state_dir")
    if want("cordon"):
        sub.add_parser("cordon", allow_abbrev=False)
    if want("torch"):
        sub.add_parser("torch", allow_abbrev=False)
    if want("carry"):
        c = sub.add_parser("carry", allow_abbrev=False)
        c.add_argument("code_root")   # ~/.clustertrain/code
        c.add_argument("run")
        c.add_argument("key")         # the work directory's (its digest)
    if verb is not None and not sub.choices:
        return _parser()   # no such verb: argparse names the ones there are
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:  # the script's own arguments follow: not ours to parse
        from . import worker
        worker.main(argv[1:])
        return 0  # not reached: the worker leaves with os._exit
    args = _parser(argv[0] if argv else None).parse_args(argv)
    if args.verb == "supervise":
        from . import supervise
        if args.argv and args.argv[0] == "--":
            args.argv = args.argv[1:]
        return supervise.run(args)
    if args.verb == "follow":
        from . import follow
        code = follow.follow(args)
        sys.stdout.flush()
        os._exit(code)  # the lease thread may be blocked reading stdin: do not wait for it
    if args.verb in ("stop", "dump"):
        job = os.path.join(os.path.expanduser("~"), args.jobs, args.run)
        if args.verb == "dump":
            from .dump import dump_workers
            print(json.dumps(dump_workers(job, args.run, args.py_spy, args.native)))
        else:
            from .stop import stop_tree
            print(json.dumps(stop_tree(job, args.run, args.grace)))
        return 0
    if args.verb in ("probe", "reach", "unlisten", "release"):
        from . import probe
        if args.verb == "probe":
            print(json.dumps(probe.probe(json.load(sys.stdin))))
        elif args.verb == "reach":
            print(json.dumps(probe.reach(json.load(sys.stdin))))
        elif args.verb == "unlisten":
            probe.stop_listener(args.port, args.nonce)
        else:
            probe.release(args.run, once_bound=args.once_bound)
        return 0
    if args.verb == "busy":
        from .busy import scan
        print(json.dumps(scan(exclude=args.exclude).to_json()))
        return 0
    if args.verb == "envs":
        from . import envs
        if args.name and args.prune is not None:
            print(json.dumps(envs.prune(args.name, args.prune)))
        else:
            print(json.dumps(envs.remove(args.name, args.key) if args.rm and args.name
                             else envs.list_envs(args.name)))
        return 0
    if args.verb == "allocate":
        from .allocate import main as allocate
        return allocate(args.name, args.gpus_per_node,
                        args.salloc[1:] if args.salloc[:1] == ["--"] else args.salloc)
    if args.verb == "carry":
        from .carry import main as carry
        return carry(args.code_root, args.run, args.key)
    if args.verb == "cordon":
        from .cordon import main as cordon
        print(json.dumps(cordon(json.load(sys.stdin))))
        return 0
    if args.verb == "standby":
        from .recover import standby
        return standby(args)
    if args.verb == "recovery-plan":
        from .util import write_json
        os.makedirs(os.path.dirname(args.path), exist_ok=True)
        write_json(args.path, json.load(sys.stdin))
        return 0
    if args.verb == "states":
        from .states import read_states
        print(json.dumps(read_states(args.state_dir)))
        return 0
    from .fingerprint import checks  # torch
    print(json.dumps(checks()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
