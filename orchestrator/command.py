"""The exact shell commands that start, follow and describe one node's part of a run
(pure: no I/O). torchrun runs under the node's supervisor (supervisor.py)."""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from . import contract, supervisor
from .errors import LaunchError
from .run_worker import FR_DIR_ENV

# Every job runs as the SSH user and keeps its state under that user's home on each
# node (mode 0700: other users cannot see it): code snapshots and per-run job records.
NODE_STATE_DIR = ".clustertrain"
# The worker runner (run_worker.py), inside each run's code snapshot: torchrun starts
# every worker through it, so that a script that finished ends cleanly (clean_exit).
WORKER_RUNNER = f"{NODE_STATE_DIR}/run_worker.py"
CODE_SUBDIR = "code"
JOBS_SUBDIR = "jobs"
JOBS_DIR = f"{NODE_STATE_DIR}/{JOBS_SUBDIR}"  # relative to the job user's home
FR_BUFFER_SIZE = "2000"  # flight-recorder entries a rank keeps (torch's default)
# torchrun prefixes every worker line with its global rank; logstream parses it.
LOG_PREFIX_TEMPLATE = "[rank${rank}]:"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The last line a node's follow session prints: torchrun's exit status and why it ended,
# so that a connection that ends without it is told apart from a job that exited.
EXIT_MARKER = supervisor.EXIT_MARKER
# The supervisor's source, shipped to the node at every launch.
SUPERVISOR_SOURCE = Path(supervisor.__file__).read_text()
SUPERVISOR_BYTES = len(SUPERVISOR_SOURCE.encode())
DEFAULT_LEASE_TIMEOUT = 30.0
DEFAULT_KEEP_RUNS = 20


def supervisor_call(python: str, verb: str, *args: str) -> str:
    """The command line that runs VERB of the supervisor's source (this version's, sent
    on the command line) with the node's system PYTHON, as the SSH user: `stop`, `dump`."""
    return f"{python} -c {shlex.quote(SUPERVISOR_SOURCE)} {shlex.join([verb, *args])}"


def state_dir(home: str) -> str:
    """The job user's state directory on a node, from that user's home directory."""
    return f"{home.rstrip('/')}/{NODE_STATE_DIR}"


def parse_env(items: list[str] | None) -> dict[str, str]:
    """`--env K=V` (repeatable) into a dict; LaunchError on a malformed item."""
    env: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not ENV_NAME.match(key):
            raise LaunchError(
                f"--env {item!r} is not KEY=VALUE with KEY a shell variable name "
                "(letters, digits, '_', not starting with a digit); for example "
                "--env LR=0.1")
        env[key] = value
    return env


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
    python: str = "/usr/bin/python3"    # the node's system python (runs the supervisor)
    run_state: str = ""                 # the run's state directory on the shared filesystem
    attached: bool = True               # stop the job when the controller's lease runs out
    lease_timeout: float = DEFAULT_LEASE_TIMEOUT
    grace: float = 5.0
    keep_runs: int = DEFAULT_KEEP_RUNS   # older snapshots and job dirs are pruned
    module: bool = False                # script is a module name, run as `python -m`
    clean_exit: bool = True             # start the workers through WORKER_RUNNER
    # Detached runs are watched for hangs by the nodes (attached ones by the controller).
    hang_timeout: float = 0.0
    on_hang: str = "stop"
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
    def job_dir(self) -> str:
        return f"{state_dir(self.home)}/{JOBS_SUBDIR}/{self.run_id}"

    def to_record(self) -> dict:
        """What run.json keeps of this command (`attach` and `runs` rebuild it)."""
        record = dataclasses.asdict(self)
        record["script_args"], record["nodes"] = list(self.script_args), list(self.nodes)
        return record

    @classmethod
    def from_record(cls, record: dict) -> NodeCommand:
        options = TorchrunOptions(**{**record["options"],
                                     "extra": tuple(record["options"].get("extra", ()))})
        return cls(**{**record, "options": options,
                      "script_args": tuple(record.get("script_args", ())),
                      "nodes": tuple(record.get("nodes", ()))})

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
        """The script part of the torchrun command: the runner, then the user's script
        (or `-m MODULE`) and its arguments; without clean_exit, torchrun runs the script."""
        target = ["-m", self.script] if self.module else [self.script]
        runner = [WORKER_RUNNER] if self.clean_exit else []
        return [*runner, *target, *self.script_args]

    @property
    def flight_records_dir(self) -> str:
        """Where the workers' flight-recorder dumps go: on request (run_worker.py serves
        them) and, with NCCL, torch's own dump when a collective times out."""
        return f"{self.job_dir}/{supervisor.FR_SUBDIR}"

    def environment(self) -> dict[str, str]:
        fr = self.flight_records_dir
        return {
            "PYTHONUNBUFFERED": "1",
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": LOG_PREFIX_TEMPLATE,
            "CLUSTERTRAIN_RUN_ID": self.run_id,
            "CLUSTERTRAIN_NODE_RANK": str(self.node_rank),
            # The flight recorder: on, with torch's default size, and dumped into the job
            # on a NCCL timeout (torch appends the rank). Only the current names: torch
            # warns about the older ones (TORCH_NCCL_TRACE_BUFFER_SIZE, ...) when set.
            FR_DIR_ENV: fr,
            "TORCH_FR_BUFFER_SIZE": FR_BUFFER_SIZE,
            "TORCH_FR_DUMP_TEMP_FILE": f"{fr}/{supervisor.TIMEOUT_DUMP_PREFIX}",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            **self.env,
        }

    def shell(self) -> str:
        """The command line that starts this node's part of the run, phase one of the
        launch (launch.py): it writes the supervisor's source (the first
        SUPERVISOR_BYTES of its standard input) into the job directory and runs it with
        --wait-go, so that it loads and waits; on GO it starts torchrun in the code
        snapshot.

        The supervisor then runs in a session of its own (setsid), outlives the SSH session,
        and starts torchrun in another session, so torchrun and its workers form a job of
        their own; torchrun's PID, also its process group id, goes to JOB_DIR/pgid.
        """
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.environment().items())
        job = shlex.quote(self.job_dir)
        env_file = shlex.quote(self.cluster_env)
        argv = [self.python, f"{self.job_dir}/supervisor.py", "run", "--wait-go",
                "--cwd", self.code_dir, "--job", self.job_dir,
                "--state-dir", self.run_state, "--run", self.run_id, "--node", self.node,
                "--nodes", ",".join(self.nodes), "--grace", str(self.grace),
                "--lease-timeout", str(self.lease_timeout), "--keep", str(self.keep_runs),
                *(["--attached"] if self.attached else
                  ["--hang-timeout", f"{self.hang_timeout:g}", "--on-hang", self.on_hang]),
                "--", *self.torchrun_argv()]
        # A job directory that cannot be made fails the launch here, with mkdir's words.
        # (head -c reads no more than it copies: GO, later on the same input, is left.)
        return (f"umask 077; mkdir -p {job} && head -c {SUPERVISOR_BYTES} "
                f">{job}/supervisor.py || exit 1; "
                f"if [ -r {env_file} ]; then set -a; . {env_file}; set +a; fi; "
                f"export {exports}; exec {shlex.join(argv)}")

    def follow(self, lease: bool = False, tail: int | None = None) -> str:
        """The command line that prints this node's output as it grows and ends with
        EXIT_MARKER; with LEASE, its standard input carries the controller's heartbeat."""
        argv = [self.python, f"{self.job_dir}/supervisor.py", "follow", "--job", self.job_dir]
        if lease:
            argv.append("--lease")
        if tail is not None:
            argv += ["--tail", str(tail)]
        return shlex.join(argv)
