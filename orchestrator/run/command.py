"""The exact shell commands that start, follow and describe one node's part of a run
(pure: no I/O). torchrun runs under the node's supervisor (`node.py supervise`, from the
node package on the node: cluster/nodelib.py)."""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass, field

from .. import contract, defaults
from ..cluster import nodelib
from ..errors import InputError
from ..node.protocol import (
    CODE_SUBDIR,
    EXIT_MARKER,
    FR_DIR_ENV,
    FR_SUBDIR,
    JOBS_SUBDIR,
    NODE_STATE_DIR,
    TIMEOUT_DUMP_PREFIX,
)
from ..node.requests import Follow, Supervise

FR_BUFFER_SIZE = "2000"  # flight-recorder entries a rank keeps (torch's default)
# torchrun prefixes every worker line with its global rank; logstream parses it.
LOG_PREFIX_TEMPLATE = "[rank${rank}]:"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
__all__ = ["EXIT_MARKER", "NodeCommand", "TorchrunOptions"]  # EXIT_MARKER: job.py reads it


def state_dir(home: str) -> str:
    """The job user's state directory on a node, from that user's home directory."""
    return f"{home.rstrip('/')}/{NODE_STATE_DIR}"


# Variables the tool and torchrun set for every worker: a job's --env may not set them
# (a CLUSTERTRAIN_RUN_ID of the user's own would hide the run from `stop`, a RANK of its
# own would break the rendezvous). The flight recorder's TORCH_FR_* stay the user's to set.
RESERVED_ENV_PREFIXES = {
    "CLUSTERTRAIN_": "set by clustertrain for every run (its id, node rank, backend, ...)",
    "TORCHELASTIC_": "set by torchrun for its workers",
}
RESERVED_ENV = {
    **{name: "set by clustertrain: node 0's cluster address and the master port it claimed "
       "(choose the port with --master-port)" for name in ("MASTER_ADDR", "MASTER_PORT")},
    **{name: "set by torchrun for each worker from --nodes/--hosts and --nproc-per-node"
       for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE")},
}


def reserved_env(key: str) -> str | None:
    """Why KEY may not be set with --env (None: it may)."""
    if key in RESERVED_ENV:
        return RESERVED_ENV[key]
    return next((why for prefix, why in RESERVED_ENV_PREFIXES.items()
                 if key.startswith(prefix)), None)


def parse_env(items: list[str] | None) -> dict[str, str]:
    """`--env K=V` (repeatable) into a dict; InputError on a malformed item or a name
    the tool or torchrun sets."""
    env: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not ENV_NAME.fullmatch(key):
            raise InputError(
                f"--env {item!r} is not KEY=VALUE with KEY a shell variable name "
                "(letters, digits, '_', not starting with a digit); for example "
                "--env LR=0.1")
        refuse_reserved(key, f"--env {key}")
        env[key] = value
    return env


def refuse_reserved(key: str, where: str) -> None:
    """InputError, said as given at WHERE, for a variable KEY that the tool or torchrun
    sets for the job."""
    why = reserved_env(key)
    if why:
        raise InputError(f"{where}: {key} is {why}; a job cannot set it. Pass your own "
                         "value under another name")


# A node's launch line is one argument of its login shell (`sh -c LINE`), and Linux takes
# at most 128 KiB in one argument (MAX_ARG_STRLEN); the line's own part is a few KiB.
ARGUMENTS_LIMIT = 100_000


def check_arguments_size(script_args: tuple[str, ...], env: dict[str, str]) -> None:
    """InputError when the script's arguments and --env values would not fit on the
    nodes' command line (ssh would fail with 'Argument list too long')."""
    size = len(shlex.join(script_args).encode()) + sum(
        len(f"{k}={shlex.quote(v)} ".encode()) for k, v in env.items())
    if size > ARGUMENTS_LIMIT:
        raise InputError(f"the script's arguments and --env values come to {size} bytes; "
                          f"a node's command line takes at most {ARGUMENTS_LIMIT} (one "
                          "argument of 128 KiB at most, Linux's limit). Put them in a file "
                          "in --workdir and pass its name to the script")


# torchrun's options that the launch sets itself, and the train option that decides each.
# torchrun (argparse) also takes '_' for '-' and unambiguous prefixes: both are matched.
TORCHRUN_SET = {
    "--nnodes": "--nodes/--hosts", "--node-rank": "the node's place in the inventory",
    "--nproc-per-node": "--nproc-per-node", "--master-addr": "node 0's cluster_address",
    "--master-port": "--master-port", "--rdzv-backend": "--rdzv-backend",
    "--rdzv-endpoint": "node 0's cluster_address and --master-port",
    "--rdzv-id": "the run id", "--max-restarts": "--max-restarts",
    "--tee": "clustertrain (every rank's output goes to the node's log)",
    "--log-dir": "clustertrain (the run's job directory)",
    "--redirects": "clustertrain (every rank's output goes to the node's log)",
    "--standalone": "--nodes/--hosts (the rendezvous is node 0's)",
    "--no-python": "--no-clean-exit and -m (how the script starts)",
    "--module": "-m/--module", "--run-path": "the script (train's SCRIPT argument)",
}
# Every long option of torchrun (torch 2.13, '-' spelling), to resolve a prefix as it would.
TORCHRUN_OPTIONS = (*TORCHRUN_SET, "--rdzv-conf", "--monitor-interval", "--start-method",
                    "--role", "--local-addr", "--logs-specs", "--local-ranks-filter",
                    "--event-log-handler", "--numa-binding", "--signals-to-handle",
                    "--duplicate-stdout-filters", "--duplicate-stderr-filters",
                    "--virtual-local-rank", "--shutdown-timeout")


def check_torchrun_args(args: tuple[str, ...]) -> None:
    """InputError for a --torchrun-arg that names an option the launch sets (--nnodes=3
    on 2 nodes would wait for a third node forever)."""
    for arg in args:
        if not arg.startswith("--"):
            if arg in ("-m", "-r", "-t"):
                raise InputError(f"--torchrun-arg={arg}: torchrun's {arg} is set by "
                                  "clustertrain (how the script starts, and where its "
                                  "output goes); leave it out")
            continue
        word = arg.split("=", 1)[0].replace("_", "-")
        matches = [o for o in TORCHRUN_OPTIONS if o == word] or [
            o for o in TORCHRUN_OPTIONS if o.startswith(word)]
        owner = [o for o in matches if o in TORCHRUN_SET]
        if owner and len(matches) == 1:
            raise InputError(f"--torchrun-arg={arg}: torchrun's {owner[0]} is set by "
                              f"clustertrain from {TORCHRUN_SET[owner[0]]}; use that "
                              "instead, and leave it out of --torchrun-arg")


# How srun is started in a step's launch line: it outlives the SSH session that started it
# (no SIGHUP, no SIGPIPE once that session's output is gone), so that the step does too.
STEP_SHELL = "trap '' HUP PIPE"


def srun_argv(job: str, node: str) -> list[str]:
    """srun starting one task on NODE as a step of Slurm job JOB (the run's allocation),
    beside the job's other steps (--overlap: each node's supervisor step, and any step of
    the user's own, share the job's CPUs and GPUs on that node). Its input and output are
    the launch's (READY, GO, STARTED); --unbuffered: each word as soon as it is said."""
    return ["srun", f"--jobid={job}", "--overlap", "--nodes=1", "--ntasks=1",
            f"--nodelist={node}", "--job-name=clustertrain-supervisor", "--quiet",
            "--unbuffered"]


@dataclass(frozen=True)
class TorchrunOptions:
    """torchrun options the user may pass through."""

    max_restarts: int = 0
    rdzv_backend: str = "static"        # static | c10d
    monitor_interval: float | None = None
    extra: tuple[str, ...] = ()         # anything else, verbatim (--torchrun-arg)


@dataclass(frozen=True)
class NodeCommand:
    """Everything that decides what runs on node NODE_RANK."""

    run_id: str
    node_rank: int
    nnodes: int
    nproc: int
    master_addr: str
    master_port: int
    torchrun: str
    home: str                           # the job user's home on this node
    script: str                         # relative to the code snapshot (module: its name)
    script_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    options: TorchrunOptions = field(default_factory=TorchrunOptions)
    node: str = ""                      # this node's inventory name
    nodes: tuple[str, ...] = ()         # every node of the run, in rank order
    addresses: tuple[str, ...] = ()     # their cluster addresses (the supervisors' ring)
    python: str = "/usr/bin/python3"    # the node's system python (runs the supervisor)
    run_state: str = ""                 # the run's state directory on the shared filesystem
    attached: bool = True               # stop the job when the controller's lease runs out
    lease_timeout: float = defaults.LEASE_TIMEOUT
    grace: float = defaults.GRACE
    keep_runs: int = defaults.KEEP_RUNS   # older snapshots and job dirs are pruned
    module: bool = False                # script is a module name, run as `python -m`
    clean_exit: bool = True             # start the workers through the worker runner
    synced: bool = True                 # a code snapshot is torchrun's working directory
    # Every run is watched for hangs by its nodes; the controller reads what they found.
    hang_timeout: float = 0.0
    on_hang: str = "stop"
    # A detached run that may recover: a peer's fault starts the next attempt on the nodes
    recovery: bool = False
    ring_ports: str = defaults.RING_PORTS   # the cluster's UDP ports for the beats
    # the common role's cluster.env on this node (NodeSpec.cluster_env_file)
    cluster_env: str = field(default_factory=lambda: str(
        contract.role_default("common", "common_cluster_env_file")))

    def __post_init__(self) -> None:
        # The supervisor cannot run without them: say so here, not in a node's log.
        missing = [name for name in ("node", "nodes", "run_state") if not getattr(self, name)]
        if missing:
            raise ValueError(f"NodeCommand for run {self.run_id} rank {self.node_rank} "
                             f"lacks {', '.join(missing)}")

    @property
    def code_dir(self) -> str:
        return f"{state_dir(self.home)}/{CODE_SUBDIR}/{self.run_id}"

    @property
    def cwd(self) -> str:
        """torchrun's working directory: the run's code snapshot, else its job directory."""
        return self.code_dir if self.synced else self.job_dir

    @property
    def job_dir(self) -> str:
        return f"{state_dir(self.home)}/{JOBS_SUBDIR}/{self.run_id}"

    def to_record(self) -> dict:
        """What run.json keeps of this command (`attach` and `runs` rebuild it)."""
        record = dataclasses.asdict(self)
        record["script_args"], record["nodes"] = list(self.script_args), list(self.nodes)
        record["addresses"] = list(self.addresses)
        return record

    @classmethod
    def from_record(cls, record: dict) -> NodeCommand:
        options = TorchrunOptions(**{**record["options"],
                                     "extra": tuple(record["options"].get("extra", ()))})
        return cls(**{**record, "options": options,
                      "script_args": tuple(record.get("script_args", ())),
                      "nodes": tuple(record.get("nodes", ())),
                      "addresses": tuple(record.get("addresses", ()))})

    def torchrun_argv(self) -> list[str]:
        argv = [self.torchrun, "--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                "--nproc-per-node", str(self.nproc)]
        if self.options.rdzv_backend == "static":
            argv += ["--master-addr", self.master_addr, "--master-port", str(self.master_port)]
        else:
            argv += ["--rdzv-backend", self.options.rdzv_backend,
                     "--rdzv-endpoint", f"{self.master_addr}:{self.master_port}",
                     "--rdzv-id", self.run_id]
        argv += ["--max-restarts", str(self.options.max_restarts)]
        if self.options.monitor_interval is not None:
            argv += ["--monitor-interval", str(self.options.monitor_interval)]
        argv += ["--tee", "3", "--log-dir", f"{self.job_dir}/torchrun-logs",
                 *self.options.extra, *self.worker_argv()]
        return argv

    def worker_argv(self) -> list[str]:
        """The script part of the torchrun command: the worker runner (`node.py worker`),
        then the user's script (or `-m MODULE`) and its arguments; without clean_exit,
        torchrun runs the script itself."""
        target = ["-m", self.script] if self.module else [self.script]
        runner = [nodelib.entry(self.home), "worker"] if self.clean_exit else []
        return [*runner, *target, *self.script_args]

    @property
    def flight_records_dir(self) -> str:
        """Where the workers' flight-recorder dumps go: on request (run_worker.py serves
        them) and, with NCCL, torch's own dump when a collective times out."""
        return f"{self.job_dir}/{FR_SUBDIR}"

    def environment(self) -> dict[str, str]:
        """The job's environment on this node: the user's --env overrides the defaults
        (the flight recorder's, say), never the names that identify the run (parse_env
        refuses them; a record made otherwise cannot hide the run from `stop` either)."""
        fr = self.flight_records_dir
        return {
            "PYTHONUNBUFFERED": "1",
            # A rank killed by a signal (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL) prints its
            # Python stack into its log first; --env PYTHONFAULTHANDLER= turns it off.
            "PYTHONFAULTHANDLER": "1",
            # The flight recorder: on, with torch's default size, and dumped into the job
            # on a NCCL timeout (torch appends the rank). Only the current names: torch
            # warns about the older ones (TORCH_NCCL_TRACE_BUFFER_SIZE, ...) when set.
            "TORCH_FR_BUFFER_SIZE": FR_BUFFER_SIZE,
            "TORCH_FR_DUMP_TEMP_FILE": f"{fr}/{TIMEOUT_DUMP_PREFIX}",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            **self.env,
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": LOG_PREFIX_TEMPLATE,
            "CLUSTERTRAIN_RUN_ID": self.run_id,
            "CLUSTERTRAIN_NODE_RANK": str(self.node_rank),
            FR_DIR_ENV: fr,
        }

    def shell(self, slurm_job: str | None = None) -> str:
        """The command line that starts this node's part of the run, phase one of the
        launch (launch.py): the node package's supervisor (`node.py supervise
        --wait-go`) loads and says READY; on GO it starts torchrun in the code snapshot.

        Without SLURM_JOB, the supervisor then runs in a session of its own (setsid) and
        outlives the SSH session; with it, the supervisor is a step of that Slurm job
        (srun: srun_argv), in the foreground of the step, which lasts as long as it does.
        Either way it starts torchrun in another session, so torchrun and its workers form
        a job of their own; torchrun's PID, also its process group id, goes to JOB_DIR/pgid.
        """
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.environment().items())
        job = shlex.quote(self.job_dir)
        env_file = shlex.quote(self.cluster_env)
        # -S: the node package is standard library only, and site's work (the
        # environment's .pth files, on the share) is a tenth of each supervisor's start.
        request = Supervise(
            job=self.job_dir, state_dir=self.run_state, run=self.run_id, node=self.node,
            nodes=self.nodes, addresses=self.addresses, cwd=self.cwd, grace=self.grace,
            lease_timeout=self.lease_timeout, attached=self.attached,
            hang_timeout=self.hang_timeout, on_hang=self.on_hang, keep_runs=self.keep_runs,
            wait_go=True, in_step=bool(slurm_job), ring_ports=self.ring_ports,
            recovery=self.recovery, rest=tuple(self.torchrun_argv()))
        argv = [self.python, "-S", nodelib.entry(self.home), request.VERB, *request.argv()]
        step = f"{STEP_SHELL}; exec {shlex.join(srun_argv(slurm_job, self.node))} " \
            if slurm_job else "exec "
        # A job directory that cannot be made fails the launch here, with mkdir's words.
        return (f"umask 077; mkdir -p {job} || exit 1; "
                f"if [ -r {env_file} ]; then set -a; . {env_file}; set +a; fi; "
                f"export {exports}; {step}{shlex.join(argv)}")

    def follow(self, lease: bool = False, tail: int | None = None, from_line: int = 0) -> str:
        """The command line that prints this node's output as it grows (its last TAIL
        lines first, or from line FROM_LINE + 1) and ends with EXIT_MARKER; with LEASE,
        its standard input carries the controller's heartbeat."""
        request = Follow(job=self.job_dir, tail=tail, from_line=0 if tail is not None
                         else from_line, lease=lease)
        return shlex.join([self.python, nodelib.entry(self.home), request.VERB,
                           *request.argv()])
