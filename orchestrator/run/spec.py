"""A run's description: what to run, where, with which policies. The only one: `train`'s
command line and a job file (`train -f job.yaml`) are both read into it, checked here
before any node is touched, `--dry-run` prints it as a job file, the run's record keeps it
and the launch is built from it.

A job file's keys are `train`'s long option names with '_' (`nodes`, `hosts`, `workdir`,
`script`, `args` as a list, `env` as a mapping, `nproc_per_node`, `hang_timeout`, ...);
paths in it are relative to the file. Options on the command line override the file's.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from .. import defaults
from ..cluster.inventory import check_env_name
from ..errors import LaunchError
from ..record.rundir import check_writable
from ..resources import project
from .command import (
    ENV_NAME,
    TorchrunOptions,
    check_arguments_size,
    check_torchrun_args,
    parse_env,
    reserved_env,
)

MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class OnHang(str, Enum):
    """What a hung run comes to, once every rank's stack is dumped and read."""
    STOP = "stop"   # stop it on every node: status "hung", a non-zero exit
    WAIT = "wait"   # keep it, and keep watching (a hang that resolves is reported again)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class HangWatch:
    """`train --hang-timeout S --on-hang stop|wait`: a run is hung when it printed
    nothing, not a line, not a beat, not a part of a line (progress.py), for S seconds;
    0 turns the watch off. The nodes watch (node/supervise.py)."""
    timeout: float = defaults.HANG_TIMEOUT
    on_hang: OnHang = OnHang.STOP


@dataclass(frozen=True)
class RunSpec:
    """A run, checked (from_sources makes one); `dry_run` is not part of it: it is what
    is done with it."""

    inventory: Path = defaults.INVENTORY
    nodes: int | None = None                # the first N nodes of train_nodes
    hosts: tuple[str, ...] | None = None    # these nodes (inventory order decides node 0)
    workdir: Path | None = None             # None: nothing to sync (a node-package module)
    script: str = defaults.SCRIPT           # relative to workdir, or a module name
    module: bool = False
    script_args: tuple[str, ...] = ()      # `args:` in a job file
    env: dict[str, str] = field(default_factory=dict)
    secret_env: tuple[str, ...] = ()        # variables passed from this shell, unrecorded
    nproc_per_node: int | None = None       # None: auto (GPUs per node, or 1 with gloo)
    master_port: int | None = None          # None: the inventory's, moved if taken
    max_restarts: int = defaults.MAX_RESTARTS
    rdzv_backend: str = defaults.RDZV_BACKEND
    torchrun_args: tuple[str, ...] = ()
    clean_exit: bool = True                 # workers start through the worker runner
    runs_dir: Path = defaults.RUNS_DIR
    grace: float = defaults.GRACE
    detach: bool = False
    lease_timeout: float = defaults.LEASE_TIMEOUT
    keep_runs: int = defaults.KEEP_RUNS
    hang_timeout: float = defaults.HANG_TIMEOUT
    on_hang: OnHang = OnHang.STOP
    doctor: bool = False                    # run doctor first; start nothing on a suspect
    ignore_suspects: bool = False
    link_seconds: float = defaults.LINK_SECONDS
    allreduce_mb: float = defaults.ALLREDUCE_MB
    share_gpus: bool = False                # run on nodes another run or GPU process uses
    queue: bool = False                     # through Slurm's queue (train --queue)
    gpus_per_node: int | None = None        # --queue: None, every GPU of a node
    partition: str | None = None            # --queue: passed to Slurm
    time: str | None = None
    qos: str | None = None
    python_env: str | None = None           # the user's own environment (env create)
    max_recoveries: int = 0                 # restarts from the checkpoint after a node failed
    spares: int = 0                         # nodes held ready for a recovery: the next K...
    spare_hosts: tuple[str, ...] | None = None   # ...or these
    min_nodes: int | None = None            # a recovery without a spare: at least this many
    run_id: str | None = None               # its record's name (None: a new one)
    cordoned_ok: bool = False               # doctor's own run: a cordoned node is no refusal

    @property
    def watch(self) -> HangWatch:
        return HangWatch(self.hang_timeout, self.on_hang)

    @property
    def options(self) -> TorchrunOptions:
        return TorchrunOptions(max_restarts=self.max_restarts, rdzv_backend=self.rdzv_backend,
                               extra=self.torchrun_args)

    def to_file(self) -> dict[str, Any]:
        """This spec as a job file's mapping (`train --dry-run` prints it; -f reads it)."""
        what: dict[str, Any] = {"module": self.script} if self.module else {
            "script": self.script}
        return {"inventory": str(self.inventory), "nodes": self.nodes,
                "hosts": list(self.hosts) if self.hosts else None,
                "workdir": str(self.workdir) if self.workdir else None, **what,
                "args": list(self.script_args), "env": dict(self.env),
                "secret_env": list(self.secret_env),
                "nproc_per_node": self.nproc_per_node or "auto",
                "master_port": self.master_port, "max_restarts": self.max_restarts,
                "rdzv_backend": self.rdzv_backend, "torchrun_arg": list(self.torchrun_args),
                "no_clean_exit": not self.clean_exit, "runs_dir": str(self.runs_dir),
                "grace": self.grace, "detach": self.detach,
                "lease_timeout": self.lease_timeout, "keep_runs": self.keep_runs,
                "hang_timeout": self.hang_timeout, "on_hang": str(self.on_hang),
                "doctor": self.doctor, "ignore_suspects": self.ignore_suspects,
                "link_seconds": self.link_seconds, "allreduce_mb": self.allreduce_mb,
                "share_gpus": self.share_gpus, "queue": self.queue,
                "gpus_per_node": self.gpus_per_node, "partition": self.partition,
                "time": self.time, "qos": self.qos, "python_env": self.python_env,
                "max_recoveries": self.max_recoveries, "spares": self.spares,
                "spare_hosts": list(self.spare_hosts) if self.spare_hosts else None,
                "min_nodes": self.min_nodes}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_file(), sort_keys=False, default_flow_style=False)


# -- a job file's keys: each one's type, as the file must give it ----------------------------
KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "inventory": ((str,), "a path"), "nodes": ((int,), "a whole number"),
    "hosts": ((list, str), "a list of inventory names"), "workdir": ((str,), "a path"),
    "script": ((str,), "a path relative to workdir"), "module": ((str,), "a module name"),
    "args": ((list,), "a list of the script's arguments"),
    "env": ((dict,), "a mapping of NAME: value"),
    "secret_env": ((list,), "a list of variable names (their values come from the shell)"),
    "nproc_per_node": ((int, str), "'auto' or a whole number"),
    "master_port": ((int,), "a port number"), "max_restarts": ((int,), "a whole number"),
    "rdzv_backend": ((str,), "static or c10d"),
    "torchrun_arg": ((list,), "a list of torchrun options"),
    "no_clean_exit": ((bool,), "true or false"), "runs_dir": ((str,), "a path"),
    "grace": ((int, float), "a number of seconds"), "detach": ((bool,), "true or false"),
    "lease_timeout": ((int, float), "a number of seconds"),
    "keep_runs": ((int,), "a whole number"),
    "hang_timeout": ((int, float), "a number of seconds"),
    "on_hang": ((str,), "stop or wait"), "doctor": ((bool,), "true or false"),
    "ignore_suspects": ((bool,), "true or false"),
    "link_seconds": ((int, float), "a number of seconds"),
    "allreduce_mb": ((int, float), "a number of MB"),
    "share_gpus": ((bool,), "true or false"),
    "queue": ((bool,), "true or false"), "gpus_per_node": ((int,), "a whole number"),
    "partition": ((str,), "a Slurm partition"), "time": ((str, int), "a Slurm time limit"),
    "qos": ((str,), "a Slurm QOS"),
    "python_env": ((str,), "the name of one of your environments (env create --name)"),
    "max_recoveries": ((int,), "a whole number"), "spares": ((int,), "a whole number"),
    "spare_hosts": ((list, str), "a list of inventory names"),
    "min_nodes": ((int,), "a whole number"),
}
PATH_KEYS = ("inventory", "workdir", "runs_dir")


@dataclass(frozen=True)
class Given:
    """A value, and where it was given: the words an error about it begins with
    (`--nodes`, or `job.yaml line 3: nodes`)."""
    value: Any
    label: str


def option(key: str) -> str:
    """The command-line option of a job file's key."""
    return {"torchrun_arg": "--torchrun-arg", "module": "-m", "args": "the script's arguments",
            "script": "the script"}.get(key, f"--{key.replace('_', '-')}")


def read_job_file(path: Path) -> dict[str, Given]:
    """A job file's keys, each with its value and where it stands; LaunchError naming the
    line for anything that is not a key of train, or of the wrong type."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise LaunchError(f"-f {path}: {exc.strerror}; give a job file (YAML, train's long "
                          "option names as keys)") from None
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise LaunchError(f"{path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not isinstance(root, yaml.MappingNode):
        raise LaunchError(f"{path} is not a mapping of train's options (e.g. `nodes: 2`)")
    lines = {k.value: k.start_mark.line + 1 for k, _ in root.value
             if isinstance(k, yaml.ScalarNode)}
    found: dict[str, Given] = {}
    for key, value in data.items():
        where = f"{path} line {lines.get(key, '?')}"
        if key not in KEYS:
            near = difflib.get_close_matches(str(key), KEYS, n=1)
            raise LaunchError(
                f"{where}: unknown key {key!r}" + (f" (did you mean {near[0]!r}?)" if near
                                                   else "")
                + f"; a job file takes {', '.join(KEYS)}. The script's own options go in "
                "`args:`")
        if value is None:
            continue  # as if not given: the default
        types, what = KEYS[key]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise LaunchError(f"{where}: {key} must be {what}, not {value!r}")
        if key in PATH_KEYS:
            value = str((path.parent / Path(str(value)).expanduser()).absolute())
        found[key] = Given(value, f"{where}: {key}")
    return found


def from_sources(given: Mapping[str, Given]) -> RunSpec:
    """The spec from the values given (a job file's, then the command line's over them),
    the defaults for the rest; LaunchError naming the first value that cannot be right,
    with where it was given and what would be."""
    def get(key: str, default: Any = None) -> Any:
        return given[key].value if key in given else default

    def label(key: str) -> str:
        return given[key].label if key in given else option(key)

    workdir = _workdir(get("workdir", str(project().train)), label("workdir"))
    module = get("module")
    script, args = get("script"), list(get("args", []))
    if module is not None:
        if not MODULE_NAME.match(module):
            raise LaunchError(f"{label('module')} {module!r} is not a module name (dotted "
                              "Python identifiers, e.g. -m mypkg.train)")
        script = module
    else:
        script = _script(workdir, script or defaults.SCRIPT)
    nproc = get("nproc_per_node", "auto")
    if nproc != "auto":
        try:
            nproc = int(nproc)
            if nproc < 1:
                raise ValueError
        except ValueError:
            raise LaunchError(f"{label('nproc_per_node')} {nproc!r}: give 'auto' or a "
                              "positive number") from None
    master_port = get("master_port")
    if master_port is not None and not 1 <= master_port <= 65535:
        raise LaunchError(f"{label('master_port')} {master_port}: choose a port in 1024-65535")
    max_restarts = get("max_restarts", defaults.MAX_RESTARTS)
    if max_restarts < 0:
        raise LaunchError(f"{label('max_restarts')} {max_restarts}: give 0 (fail on the first "
                          "worker failure) or a positive number of restarts")
    rdzv = get("rdzv_backend", defaults.RDZV_BACKEND)
    if rdzv not in ("static", "c10d"):
        raise LaunchError(f"{label('rdzv_backend')} {rdzv!r}: give static or c10d")
    grace = float(get("grace", defaults.GRACE))
    check_grace(grace, label("grace"))
    keep_runs = get("keep_runs", defaults.KEEP_RUNS)
    if keep_runs < 0:
        raise LaunchError(f"{label('keep_runs')} {keep_runs}: give 0 (keep all) or more")
    lease = float(get("lease_timeout", defaults.LEASE_TIMEOUT))
    if not math.isfinite(lease) or lease < 3:
        raise LaunchError(f"{label('lease_timeout')} {get('lease_timeout')}: give at least "
                          "3 seconds")
    hang = float(get("hang_timeout", defaults.HANG_TIMEOUT))
    if not math.isfinite(hang) or hang < 0:
        raise LaunchError(f"{label('hang_timeout')} {get('hang_timeout')}: give the seconds "
                          "without progress after which the run counts as hung, as a "
                          "number of 0 or more (0: never; default "
                          f"{defaults.HANG_TIMEOUT:g})")
    on_hang = get("on_hang", defaults.ON_HANG)
    if on_hang not in [str(o) for o in OnHang]:
        raise LaunchError(f"{label('on_hang')} {on_hang!r}: give stop or wait")
    if get("ignore_suspects") and not get("doctor"):
        raise LaunchError("--ignore-suspects goes with --doctor")
    link_seconds = float(get("link_seconds", defaults.LINK_SECONDS))
    allreduce_mb = float(get("allreduce_mb", defaults.ALLREDUCE_MB))
    check_measures(link_seconds, allreduce_mb, label)
    env = _env(given["env"]) if "env" in given else {}
    secret_env = _secret_env(given["secret_env"], env) if "secret_env" in given else ()
    torchrun_args = tuple(str(a) for a in get("torchrun_arg", []))
    check_torchrun_args(torchrun_args)
    args = [str(a) for a in args]
    check_arguments_size(tuple(args), env)
    runs_dir = Path(str(get("runs_dir", defaults.RUNS_DIR)))
    check_writable(runs_dir, label("runs_dir"))
    queue = queue_options(get, label)
    python_env = get("python_env")
    if python_env is not None:
        check_env_name(str(python_env), label("python_env"))
    hosts = get("hosts")
    if isinstance(hosts, str):  # as given: the inventory names an empty one (Cluster.select)
        hosts = [h.strip() for h in hosts.split(",")]
    return RunSpec(
        inventory=Path(get("inventory", str(defaults.INVENTORY))), nodes=get("nodes"),
        hosts=tuple(hosts) if hosts is not None else None, workdir=workdir, script=script,
        module=module is not None, script_args=tuple(args), env=env, secret_env=secret_env,
        nproc_per_node=None if nproc == "auto" else nproc, master_port=master_port,
        max_restarts=max_restarts, rdzv_backend=rdzv, torchrun_args=torchrun_args,
        clean_exit=not get("no_clean_exit", False), runs_dir=runs_dir, grace=grace,
        detach=bool(get("detach", False)), lease_timeout=lease, keep_runs=keep_runs,
        hang_timeout=hang, on_hang=OnHang(on_hang), doctor=bool(get("doctor", False)),
        ignore_suspects=bool(get("ignore_suspects", False)), link_seconds=link_seconds,
        allreduce_mb=allreduce_mb, share_gpus=bool(get("share_gpus", False)),
        python_env=python_env, **queue, **_recovery(get, label, queue["queue"]))


def _recovery(get: Callable[..., Any], label: Callable[[str], str],
              queue: bool) -> dict[str, Any]:
    """--max-recoveries and its spares, checked: they go together."""
    most = get("max_recoveries", 0)
    spares, hosts, least = get("spares", 0), get("spare_hosts"), get("min_nodes")
    if isinstance(hosts, str):
        hosts = [h.strip() for h in hosts.split(",") if h.strip()]
    for key, value in (("max_recoveries", most), ("spares", spares)):
        if value < 0:
            raise LaunchError(f"{label(key)} {value}: give 0 or more")
    if least is not None and least < 1:
        raise LaunchError(f"{label('min_nodes')} {least}: give 1 or more nodes")
    given = [k for k, v in (("spares", spares), ("spare_hosts", hosts), ("min_nodes", least))
             if v]
    if given and not most:
        raise LaunchError(f"{label(given[0])} goes with --max-recoveries N (how many times a "
                          "run whose node failed starts again from its checkpoint); add it, "
                          "or leave it out")
    if spares and hosts:
        raise LaunchError(f"{label('spares')} and {label('spare_hosts')}: give one of them "
                          "(K spare nodes from the inventory's order, or these nodes)")
    if most and queue:
        raise LaunchError(f"{label('max_recoveries')} with --queue: a run through Slurm's "
                          "queue does not recover yet (Slurm would have to grant the "
                          "spares); run without --queue, or without --max-recoveries")
    return {"max_recoveries": most, "spares": spares,
            "spare_hosts": tuple(hosts) if hosts else None, "min_nodes": least}


SLURM_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SLURM_TIME = re.compile(r"^\d+(-\d+)?(:\d+){0,2}$")


def queue_options(get: Callable[..., Any], label: Callable[[str], str]) -> dict[str, Any]:
    """--queue and its options, checked: they go together."""
    queue = bool(get("queue", False))
    given = [k for k in ("gpus_per_node", "partition", "time", "qos") if get(k) is not None]
    if given and not queue:
        raise LaunchError(f"{label(given[0])} goes with --queue (a run through Slurm's "
                          "queue); add --queue, or leave it out")
    gpus = get("gpus_per_node")
    if gpus is not None and gpus < 0:
        raise LaunchError(f"{label('gpus_per_node')} {gpus}: give 0 or more GPUs per node")
    for key, pattern, example in (("partition", SLURM_NAME, "gpu"), ("qos", SLURM_NAME, "normal"),
                                  ("time", SLURM_TIME, "2:00:00 or 1-00:00:00")):
        value = get(key)
        if value is not None and not pattern.match(str(value)):
            raise LaunchError(f"{label(key)} {value!r}: give a Slurm {key} (e.g. {example})")
    return {"queue": queue, "gpus_per_node": gpus, "partition": get("partition"),
            "time": None if get("time") is None else str(get("time")), "qos": get("qos")}


def check_grace(grace: float, label: str = "--grace") -> None:
    if not math.isfinite(grace) or grace < 0:
        raise LaunchError(f"{label} {grace}: give the seconds between SIGTERM and SIGKILL "
                          f"as a number of 0 or more (default {defaults.GRACE:g})")


def _workdir(value: str, label: str) -> Path:
    workdir = Path(value).expanduser()
    if not workdir.is_dir():
        raise LaunchError(f"{label} {workdir}: no such directory; point --workdir at the "
                          "directory that holds your training code")
    return workdir.resolve()


def _script(workdir: Path, script: str) -> str:
    """SCRIPT as a path relative to WORKDIR, checked to be a file in it."""
    if Path(script).is_absolute():
        try:
            script = str(Path(script).resolve().relative_to(workdir))
        except ValueError:
            raise LaunchError(f"script {script} is outside --workdir {workdir}; only "
                              "the work directory is copied to the nodes") from None
    if (workdir / script).is_dir():
        inside = sorted(p.name for p in (workdir / script).glob("*.py"))[:5]
        raise LaunchError(f"script {script!r} is a directory in {workdir}; name the "
                          "script in it" + (f" (it holds {', '.join(inside)})" if inside else "")
                          + ", or run a package with -m")
    if not (workdir / script).is_file():
        raise LaunchError(f"script {script!r} not found in {workdir}; give a path "
                          "relative to --workdir (default: the repository's train/)")
    return script


def _secret_env(given: Given, env: Mapping[str, str],
                environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """--secret-env NAME items (a list): each a variable name the job may set, not also
    given a value with --env, and set in this shell's environment (ENVIRON)."""
    environ = os.environ if environ is None else environ
    names = []
    for name in given.value:
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise LaunchError(f"{given.label} {name!r}: not a variable name (letters, "
                              "digits, '_', not starting with a digit), e.g. WANDB_API_KEY")
        why = reserved_env(name)
        if why:
            raise LaunchError(f"{given.label} {name}: {name} is {why}; a job cannot set it")
        if name in env:
            raise LaunchError(f"{given.label} {name}: also given a value with --env; give "
                              "it once (--env values are recorded, --secret-env ones not)")
        if name not in environ:
            raise LaunchError(f"{given.label} {name}: not set in this shell's environment; "
                              f"set it first (`read -rs {name} && export {name}`), then run "
                              "again")
        if name not in names:
            names.append(name)
    return tuple(names)


def _env(given: Given) -> dict[str, str]:
    """--env K=V items (a list), or a job file's `env:` mapping, checked alike."""
    if isinstance(given.value, list):
        return parse_env(given.value)
    env = {}
    for key, value in given.value.items():
        key = str(key)
        if not ENV_NAME.match(key):
            raise LaunchError(f"{given.label}: {key!r} is not a variable name (letters, "
                              "digits, '_', not starting with a digit)")
        why = reserved_env(key)
        if why:
            raise LaunchError(f"{given.label}: {key} is {why}; a job cannot set it. Pass "
                              "your own value under another name")
        env[key] = "" if value is None else str(value)
    return env


def with_run_id(spec: RunSpec, run_id: str) -> RunSpec:
    return replace(spec, run_id=run_id)


# --- doctor's measurements (train --doctor, doctor) ----------------------------------------

MAX_SECONDS = 60.0          # --link-seconds, --compute-seconds
MAX_ALLREDUCE_MB = 8192.0   # --allreduce-mb: 8 GB per rank


def check_measures(link_seconds: float, allreduce_mb: float,
                   label: Callable[[str], str] = lambda key: f"--{key.replace('_', '-')}",
                   compute_seconds: float = defaults.COMPUTE_SECONDS) -> None:
    """LaunchError for a measurement doctor cannot make; LABEL: where each was given."""
    for key, value in (("link_seconds", link_seconds), ("compute_seconds", compute_seconds)):
        if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
            raise LaunchError(f"{label(key)} {value:g}: give a number above 0 and at most "
                              f"{MAX_SECONDS:g} (seconds to measure)")
    if not math.isfinite(allreduce_mb) or not 0 < allreduce_mb <= MAX_ALLREDUCE_MB:
        raise LaunchError(f"{label('allreduce_mb')} {allreduce_mb:g}: give a number above 0 and "
                          f"at most {MAX_ALLREDUCE_MB:g} (the all_reduce's size in MB; every "
                          "rank holds a tensor of that size)")
