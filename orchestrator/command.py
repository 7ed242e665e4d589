"""The exact shell command that starts torchrun on one node (pure: no I/O)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from .errors import LaunchError

# Every job runs as the SSH user and keeps its state under that user's home on each
# node (mode 0700: other users cannot see it): code snapshots and per-run job records.
NODE_STATE_DIR = ".clustertrain"
CODE_SUBDIR = "code"
JOBS_SUBDIR = "jobs"
CLUSTER_ENV = "/etc/clustertrain/cluster.env"
# torchrun prefixes every worker line with its global rank; logstream parses it.
LOG_PREFIX_TEMPLATE = "[rank${rank}]:"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The last line of every launch: torchrun's exit status, so that a connection that ends
# without it is told apart from a job that exited (even with 255, ssh's own error code).
EXIT_MARKER = "@@clustertrain-exit"


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
    script: str                         # relative to the code snapshot
    script_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    options: TorchrunOptions = field(default_factory=TorchrunOptions)

    @property
    def code_dir(self) -> str:
        return f"{state_dir(self.home)}/{CODE_SUBDIR}/{self.run_id}"

    @property
    def job_dir(self) -> str:
        return f"{state_dir(self.home)}/{JOBS_SUBDIR}/{self.run_id}"

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
                 *self.options.extra, self.script, *self.script_args]
        return argv

    def environment(self) -> dict[str, str]:
        return {
            "PYTHONUNBUFFERED": "1",
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": LOG_PREFIX_TEMPLATE,
            "CLUSTERTRAIN_RUN_ID": self.run_id,
            "CLUSTERTRAIN_NODE_RANK": str(self.node_rank),
            **self.env,
        }

    def shell(self) -> str:
        """The command line given to the node's shell over SSH.

        torchrun runs in a new session (setsid), so it and its workers form a job of
        their own; its PID, which is also its process group id, is written to
        JOB_DIR/pgid for `stop` and teardown. `setsid -w` waits for torchrun; its exit
        status is printed as the last line (EXIT_MARKER) and passed on.
        """
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.environment().items())
        job, code = shlex.quote(self.job_dir), shlex.quote(self.code_dir)
        inner = (f"echo $$ > {job}/pgid; "
                 f"if [ -r {CLUSTER_ENV} ]; then set -a; . {CLUSTER_ENV}; set +a; fi; "
                 f"export {exports}; "
                 f"exec {shlex.join(self.torchrun_argv())}")
        return (f"umask 077; mkdir -p {job} && cd {code} && "
                f"{{ setsid -w /bin/sh -c {shlex.quote(inner)} </dev/null 2>&1; rc=$?; "
                f"echo \"{EXIT_MARKER} $rc\"; exit $rc; }}")
