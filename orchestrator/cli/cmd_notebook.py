"""`notebook`: JupyterLab on a node, reached through SSH (orchestrator/workloads/notebook_run.py);
`notebook connect RUN` opens the way to a detached one again, `notebook stop RUN` ends it."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import defaults
from ..errors import InputError
from ..run.spec import Given
from ..workloads.notebook_run import DEFAULT_IDLE, connect_notebook, notebook_spec, run_notebook
from . import cmd_stop, values

# The options of `notebook` (start) that make its run: destination -> the spec's key.
START_KEYS = ("inventory", "host", "python_env", "detach", "idle", "runs_dir", "share_gpus",
              "queue", "gpus_per_node", "partition", "time", "qos")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "notebook", help="JupyterLab on a node, in the cluster's environment, through SSH",
        argument_default=argparse.SUPPRESS,
        description="Start JupyterLab as you on a node (the least busy, or --host), as a "
        "run: checked like a run, supervised like one (it ends with this command: Ctrl-C, "
        "a closed terminal, kill -9), listed by `runs`. It listens on the node's loopback "
        "only; an SSH tunnel (your SSH to the nodes, bastion included) brings it here, "
        "and its URL with a token is printed. `notebook connect RUN` opens the tunnel to "
        "a detached notebook again; `notebook stop RUN` ends it.")
    p.add_argument("action", nargs="?", choices=("start", "connect", "stop"), default=None,
                   help="start (default), connect RUN or stop RUN")
    p.add_argument("run", nargs="?", default=None, type=values.run_id,
                   help="the notebook's run id (connect, stop)")
    values.add_inventory(p, None)
    p.add_argument("--host", metavar="NODE", type=values.node("a notebook runs on one node"),
                   help="the node, by inventory name (default: the training node with the "
                   "fewest runs and GPU processes; with --queue, the one Slurm grants)")
    p.add_argument("--python-env", metavar="NAME",
                   help="the kernels run in your own environment NAME (env create) instead "
                   "of the cluster's; it needs jupyterlab")
    p.add_argument("--port", type=values.port(), metavar="PORT",
                   help="this machine's end of the tunnel (default: 8888 or the next free "
                   "port)")
    p.add_argument("--detach", action="store_true",
                   help="keep the notebook running when this command ends; it ends itself "
                   "after --idle seconds without a request")
    p.add_argument("--idle", type=float, metavar="S",
                   help=f"with --detach: seconds without a request after which the notebook "
                   f"ends (0: never; default {DEFAULT_IDLE:g})")
    p.add_argument("--share-gpus", action="store_true",
                   help="start even on a node another run or GPU process uses")
    values.add_runs_dir(p, None)
    p.add_argument("--grace", type=float,
                   help=f"stop: seconds between SIGTERM and SIGKILL (default: {defaults.GRACE:g})")
    q = p.add_argument_group("through Slurm's queue (an inventory with cluster_scheduler: slurm)")
    q.add_argument("--queue", action="store_true",
                   help="ask Slurm for the node and wait in its queue")
    # These four are checked as train's are (run/spec.py: the spec's declared options).
    q.add_argument("--gpus-per-node", type=int, metavar="G",
                   help="GPUs to ask for (default: every GPU of the node)")
    q.add_argument("--partition", help="Slurm partition")
    q.add_argument("--time", help="Slurm time limit, e.g. 2:00:00")
    q.add_argument("--qos", help="Slurm QOS")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    action = getattr(args, "action", None) or "start"
    runs_dir = Path(getattr(args, "runs_dir", defaults.RUNS_DIR))
    port = getattr(args, "port", None)
    if action == "start":
        if getattr(args, "run", None):
            raise InputError(f"notebook {args.run}: a run id goes with connect or stop "
                              f"(notebook connect {args.run}); to start one, give none")
        given = {key: Given(getattr(args, key), "--" + key.replace("_", "-"))
                 for key in START_KEYS if hasattr(args, key)}
        return run_notebook(notebook_spec(given), port)
    if not getattr(args, "run", None):
        raise InputError(f"notebook {action} needs the notebook's run id (see `runs`)")
    if action == "connect":
        return connect_notebook(runs_dir, args.run, port)
    return cmd_stop._main(argparse.Namespace(
        run=args.run, runs_dir=str(runs_dir), inventory=getattr(args, "inventory", None),
        grace=getattr(args, "grace", defaults.GRACE)))
