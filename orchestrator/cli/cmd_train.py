"""`train`: read the run from the command line (and `-f JOB_FILE`) into its spec
(orchestrator/run/spec.py), run it (orchestrator/run/lifecycle.py), exit with its status."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import defaults
from ..errors import LaunchError
from ..resources import project
from ..run.spec import Given, OnHang, from_sources, read_job_file
from ..workloads.train import train

# The options a job file may also give: destination -> its key in the file.
FILE_KEYS = {
    "inventory": "inventory", "nodes": "nodes", "hosts": "hosts", "workdir": "workdir",
    "env": "env", "secret_env": "secret_env", "nproc_per_node": "nproc_per_node",
    "master_port": "master_port",
    "max_restarts": "max_restarts", "rdzv_backend": "rdzv_backend",
    "torchrun_arg": "torchrun_arg", "runs_dir": "runs_dir", "grace": "grace",
    "detach": "detach", "lease_timeout": "lease_timeout", "keep_runs": "keep_runs",
    "hang_timeout": "hang_timeout", "on_hang": "on_hang", "doctor": "doctor",
    "ignore_suspects": "ignore_suspects", "link_seconds": "link_seconds",
    "allreduce_mb": "allreduce_mb", "module": "module", "no_clean_exit": "no_clean_exit",
    "share_gpus": "share_gpus", "queue": "queue", "gpus_per_node": "gpus_per_node",
    "partition": "partition", "time": "time", "qos": "qos", "python_env": "python_env",
    "max_recoveries": "max_recoveries", "spares": "spares", "spare_hosts": "spare_hosts",
    "min_nodes": "min_nodes",
}


def sources(args: argparse.Namespace) -> dict[str, Given]:
    """What the run is given: the job file's values (-f), the command line's over them."""
    given = read_job_file(Path(args.file)) if getattr(args, "file", None) else {}
    for dest, key in FILE_KEYS.items():
        if hasattr(args, dest):
            given[key] = Given(getattr(args, dest), "--" + dest.replace("_", "-")
                               if dest != "module" else "-m")
    script = getattr(args, "script", None)
    rest = list(getattr(args, "script_args", None) or [])
    check_no_tool_options(args.tool_options, script, rest)
    rest += getattr(args, "after_separator", None) or []   # after `--`: the script's
    if hasattr(args, "module"):  # `-m pkg.mod -- ARGS`: a word after it is an argument
        rest = [*([script] if script else []), *rest]
        given.pop("script", None)
        given["args"] = Given(rest, "the script's arguments")
    elif script is not None and not script.startswith("-"):
        given.pop("module", None)
        given["script"] = Given(script, "the script")
        given["args"] = Given(rest, "the script's arguments")
    elif script is not None or rest:   # `--` and no script: the default script's
        given["args"] = Given(([script] if script else []) + rest, "the script's arguments")
    return given


def check_no_tool_options(ours: frozenset[str], script: str | None, rest: list[str]) -> None:
    """Everything after the script goes to the script, but one of train's own options
    (OURS) there, before any `--`, was surely meant for train: refuse it, saying where it
    goes."""
    if not script or script.startswith("-"):
        return
    for word in rest:
        if word == "--":
            return
        if word.split("=", 1)[0] in ours:
            raise LaunchError(
                f"{word} comes after the script {script}, where it would be the script's "
                f"argument, but it is an option of train: put it before the script "
                f"(train {word} ... {script}), or after -- to pass it to the script "
                f"(train ... {script} -- {word})")


def unknown_hint(tail: list[str]) -> str:
    """What an option train does not know (TAIL: the words from it on) most likely is:
    the script's."""
    return ("options for the script go after --, e.g. python -m orchestrator train "
            f"--nodes 2 [SCRIPT] -- {' '.join(tail)}")


def register(sub: argparse._SubParsersAction) -> None:
    # Options not given are left out (SUPPRESS): a job file's value then stands.
    p = sub.add_parser("train", help="run a training script on the cluster with torchrun",
                       argument_default=argparse.SUPPRESS,
                       description="Preflight every node, copy the code into a per-run "
                       "snapshot, start torchrun on all nodes at once, stream their logs, "
                       "and stop the job everywhere if one node fails or on Ctrl-C. The run "
                       "can be given as a job file (-f): YAML whose keys are these long "
                       "options with '_' (args: the script's arguments, as a list; env: a "
                       "mapping); options given here override it.")
    p.add_argument("-f", "--file", metavar="JOB_FILE",
                   help="the run as a job file (train --dry-run prints one)")
    p.add_argument("-i", "--inventory",
                   help=f"Ansible inventory, the one site.yml uses (default: "
                   f"{defaults.INVENTORY})")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--nodes", type=int, help="use the first N nodes of train_nodes")
    group.add_argument("--hosts", help="use these nodes, by inventory name: a,b")
    p.add_argument("--workdir", help="local directory with the training code (default: "
                   f"{project().train})")
    p.add_argument("--env", action="append", metavar="K=V",
                   help="environment variable for the job (repeatable); its value is kept "
                   "in the run's record and shown by --dry-run: for a secret, use "
                   "--secret-env")
    p.add_argument("--secret-env", action="append", metavar="NAME",
                   help="pass the variable NAME of this shell's environment to every rank "
                   "(repeatable): its value goes to the nodes over SSH only, never into a "
                   "record, a log or a command line (an API token, a password)")
    p.add_argument("--nproc-per-node",
                   help="processes per node: a number, or auto (GPUs per node; 1 with gloo "
                   "on CPU nodes) (default: auto)")
    p.add_argument("--master-port", type=int,
                   help="rendezvous port on node 0 (default: cluster_rendezvous_port or "
                   f"{defaults.RENDEZVOUS_PORT}; another free one is picked if it is in use)")
    p.add_argument("--max-restarts", type=int,
                   help=f"torchrun --max-restarts (default: {defaults.MAX_RESTARTS})")
    p.add_argument("--rdzv-backend", choices=("static", "c10d"),
                   help="rendezvous: static (--master-addr/--master-port) or c10d "
                   f"(default: {defaults.RDZV_BACKEND})")
    p.add_argument("--torchrun-arg", action="append", metavar="ARG",
                   help="extra torchrun option, verbatim (repeatable), e.g. "
                   "--torchrun-arg=--monitor-interval=1")
    p.add_argument("--runs-dir", help=f"where run records go (default: {defaults.RUNS_DIR})")
    p.add_argument("--grace", type=float, help="seconds between SIGTERM and SIGKILL at "
                   f"teardown (default: {defaults.GRACE:g})")
    p.add_argument("--detach", action="store_true",
                   help="return once the job runs on every node; the nodes supervise it "
                   "(follow it with `attach RUN`, stop it with `stop RUN`)")
    p.add_argument("--lease-timeout", type=float,
                   help="seconds after which the nodes stop an attached run whose "
                   "controller vanished without a word (killed, network cut, laptop "
                   "asleep); a closed terminal or kill -9 is noticed at once "
                   f"(default: {defaults.LEASE_TIMEOUT:g})")
    p.add_argument("--keep-runs", type=int, metavar="N",
                   help="on each node, keep the code snapshots and job directories of the "
                   "N newest runs (never a live run's); 0 keeps all (default: "
                   f"{defaults.KEEP_RUNS})")
    p.add_argument("--hang-timeout", type=float, metavar="S",
                   help="the run is hung when it printed nothing (no line, no beat) for S "
                   "seconds: every rank's stack is then dumped and the rank that holds the "
                   "others up is named (runs/RUN/hang/). Keep it below the backend's "
                   "collective timeout (NCCL 10 min, gloo 30 min by default), or the ranks "
                   f"fail before they are dumped; 0: never (default: {defaults.HANG_TIMEOUT:g})")
    p.add_argument("--on-hang", choices=[str(o) for o in OnHang],
                   help="after the diagnosis of a hang: stop the run (status hung, exit 1) "
                   f"or wait (keep it, keep watching) (default: {defaults.ON_HANG})")
    p.add_argument("--python-env", metavar="NAME",
                   help="run torchrun and the workers from your own environment NAME (made "
                   "with `env create --name NAME`) on every node, instead of the cluster's; "
                   "preflight checks it for drift as it checks the cluster's")
    p.add_argument("--share-gpus", action="store_true",
                   help="run even on nodes in use by another run (any user's, yours too) "
                   "or by a process on a GPU; without it, such a node is refused, naming "
                   "the user, the run and the GPUs")
    q = p.add_argument_group("through Slurm's queue (an inventory with cluster_scheduler: slurm)")
    q.add_argument("--queue", action="store_true",
                   help="ask Slurm for N nodes x G GPUs and wait in its queue (one live "
                   "line: place, reason, who holds the GPUs); the run then runs on the "
                   "nodes Slurm chose, each rank seeing only its GPUs, and the allocation "
                   "is given back however train ends")
    q.add_argument("--gpus-per-node", type=int, metavar="G",
                   help="GPUs per node to ask for (default: every GPU of a node)")
    q.add_argument("--partition", help="Slurm partition (default: the cluster's default)")
    q.add_argument("--time", help="Slurm time limit, e.g. 2:00:00 or 1-00:00:00")
    q.add_argument("--qos", help="Slurm QOS")
    r = p.add_argument_group("recovery from a failed node")
    r.add_argument("--max-recoveries", type=int, metavar="N",
                   help="when a node fails (lost, its torchrun or supervisor killed, a rank "
                   "killed by a signal), start the run again from its newest checkpoint, "
                   "at most N times, on the healthy nodes and a spare; the node is "
                   "cordoned. A failure of the script itself is not retried (default: 0)")
    r.add_argument("--spares", type=int, metavar="K",
                   help="the K inventory nodes after the run's own, held ready for a recovery")
    r.add_argument("--spare-hosts", metavar="a,b",
                   help="these nodes held ready for a recovery (inventory names)")
    r.add_argument("--min-nodes", type=int, metavar="M",
                   help="with no spare left, recover on the healthy nodes alone if they are "
                   "at least M (the script must accept another world size)")
    p.add_argument("--dry-run", action="store_true", default=False,
                   help="check the nodes and print the exact per-node commands and the run "
                   "as a job file; start nothing")
    p.add_argument("--doctor", action="store_true",
                   help="run `doctor` on the nodes first and start nothing if it names a "
                   "suspect")
    p.add_argument("--ignore-suspects", action="store_true",
                   help="with --doctor: start the run even if doctor names suspects")
    p.add_argument("--link-seconds", type=float,
                   help="doctor: seconds of traffic per direction of each link (default: "
                   f"{defaults.LINK_SECONDS:g})")
    p.add_argument("--allreduce-mb", type=float,
                   help=f"doctor: size of the all_reduce, in MB (default: "
                   f"{defaults.ALLREDUCE_MB:g})")
    p.add_argument("-m", "--module", metavar="MODULE",
                   help="run a module as `python -m MODULE` (from --workdir, or installed "
                   "on the nodes) instead of a script; its arguments follow --")
    p.add_argument("--no-clean-exit", action="store_true",
                   help="start the script itself, not through the worker runner that ends "
                   "each finished worker with os._exit after atexit handlers and a flush "
                   "of every open file (which keeps torch's teardown from failing a "
                   "finished run)")
    p.add_argument("script", nargs="?", default=None,
                   help=f"training script, relative to --workdir (default: {defaults.SCRIPT})")
    p.add_argument("script_args", nargs=argparse.REMAINDER, default=[],
                   help="arguments for the script (after --)")
    p.set_defaults(func=_main, unknown_hint=unknown_hint, takes_separator=True,
                   tool_options=frozenset(o for a in p._actions for o in a.option_strings))


def parse_request(args: argparse.Namespace):  # noqa: ANN201 - the spec
    """The run's spec from the parsed command line (and its job file)."""
    return from_sources(sources(args))


def _main(args: argparse.Namespace) -> int:
    return train(parse_request(args), dry_run=args.dry_run)
