"""A run's description: what to run, where, with which policies. The only one: `train`'s
command line and a job file (`train -f job.yaml`) are both read into it, checked here
before any node is touched, `--dry-run` prints it as a job file, the run's record keeps it
and the launch is built from it.

Each of train's options is declared once, as a field of RunSpec (config/options.py): its
kind in a job file, its help, its spelling, its check. The parser (cli/cmd_train.py), the
job file's keys, from_sources and to_file all come from those fields; the rules between
options (RULES) stand beside them. A job file's keys are the long option names with '_'
(`args` as a list, `env` as a mapping); paths in it are relative to the file. Options on
the command line override the file's.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from .. import defaults
from ..cluster.inventory import check_env_name
from ..config.kinds import (
    Either,
    Flag,
    Kind,
    ListOf,
    MapOf,
    Number,
    Record,
    Text,
    Whole,
    read_file,
)
from ..config.options import Declared, Option, declared, option
from ..errors import InputError
from ..record.rundir import RUN_ID, RunDir, check_writable
from ..resources import project
from .command import (
    ENV_NAME,
    TorchrunOptions,
    check_arguments_size,
    check_torchrun_args,
    parse_env,
    refuse_reserved,
)

MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
SLURM_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
SLURM_TIME = re.compile(r"\d+(-\d+)?(:\d+){0,2}")
MAX_SECONDS = 60.0          # --link-seconds, --compute-seconds
MAX_ALLREDUCE_MB = 8192.0   # --allreduce-mb: 8 GB per rank


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


# -- each option's own check: (value as given, where it was given) -> the field's value ------
def _at_least(least: int, fix: str) -> Callable[[Any, str], int]:
    def check(value: Any, label: str) -> int:
        if value < least:
            raise InputError(f"{label} {value}: {fix}")
        return int(value)
    return check


def _seconds(least: float, fix: str, above: bool = False) -> Callable[[Any, str], float]:
    def check(value: Any, label: str) -> float:
        seconds = float(value)
        if not math.isfinite(seconds) or seconds < least or above and seconds == least:
            raise InputError(f"{label} {value}: {fix}")
        return seconds
    return check


def _slurm(pattern: re.Pattern[str], what: str, example: str) -> Callable[[Any, str], str]:
    def check(value: Any, label: str) -> str:
        if not pattern.fullmatch(str(value)):
            raise InputError(f"{label} {value!r}: give a Slurm {what} (e.g. {example})")
        return str(value)
    return check


def _nproc(value: Any, label: str) -> int | None:
    if value == "auto":
        return None
    try:
        nproc = int(value)
        if nproc < 1:
            raise ValueError
    except ValueError:
        raise InputError(f"{label} {value!r}: give 'auto' or a positive number") from None
    return nproc


def _port(value: int, label: str) -> int:
    if not 1024 <= value <= 65535:
        raise InputError(f"{label} {value}: choose a port in 1024-65535")
    return value


def _choice(*allowed: str) -> Callable[[Any, str], str]:
    def check(value: Any, label: str) -> str:
        if value not in allowed:
            raise InputError(f"{label} {value!r}: give {' or '.join(allowed)}")
        return str(value)
    return check


def _run_id(value: Any, label: str) -> str:
    if not RUN_ID.fullmatch(str(value)):
        raise InputError(f"{label} {value!r}: a run id is a letter or digit, then up to 80 "
                         "letters, digits, '.', '_' or '-'")
    return str(value)


def _hosts(value: Any, label: str) -> tuple[str, ...]:
    """--hosts a,b or a list; an empty name is the inventory's to name (Cluster.select)."""
    return tuple(h.strip() for h in value.split(",")) if isinstance(value, str) else tuple(
        value)


def _spare_hosts(value: Any, label: str) -> tuple[str, ...]:
    names = [h.strip() for h in value.split(",")] if isinstance(value, str) else list(value)
    if not any(names) or "" in names:
        raise InputError(f"{label} {value!r} " + ("names no node" if not any(names) else
                                                  "has an empty name")
                         + "; give inventory names separated by commas, e.g. "
                         "--spare-hosts node2,node3")
    return tuple(names)


def _env(value: Any, label: str) -> dict[str, str]:
    """--env K=V items (a list), or a job file's `env:` mapping, checked alike."""
    if isinstance(value, list):
        return parse_env(value)
    env = {}
    for key, text in value.items():
        if not ENV_NAME.fullmatch(key):
            raise InputError(f"{label}: {key!r} is not a variable name (letters, "
                             "digits, '_', not starting with a digit)")
        refuse_reserved(key, label)
        env[key] = text
    return env


def _secret_env(value: Any, label: str) -> tuple[str, ...]:
    """--secret-env NAME items: each a variable name the job may set, and set in this
    shell's environment (whose value never enters the spec)."""
    names: list[str] = []
    for name in value:
        if not ENV_NAME.fullmatch(name):
            raise InputError(f"{label} {name!r}: not a variable name (letters, "
                             "digits, '_', not starting with a digit), e.g. WANDB_API_KEY")
        refuse_reserved(name, f"{label} {name}")
        if name not in os.environ:
            raise InputError(f"{label} {name}: not set in this shell's environment; "
                             f"set it first (`read -rs {name} && export {name}`), then run "
                             "again")
        if name not in names:
            names.append(name)
    return tuple(names)


def _torchrun_args(value: Any, label: str) -> tuple[str, ...]:
    args = tuple(str(a) for a in value)
    check_torchrun_args(args)
    return args


def _runs_dir(value: Any, label: str) -> Path:
    path = Path(str(value))
    check_writable(path, label)
    return path


def _python_env(value: Any, label: str) -> str:
    return check_env_name(str(value), label)


def _path(value: Any, label: str) -> Path:
    return Path(str(value))


def _link_seconds(value: Any, label: str) -> float:
    check_measures(float(value), defaults.ALLREDUCE_MB, lambda key: label)
    return float(value)


def _allreduce_mb(value: Any, label: str) -> float:
    check_measures(defaults.LINK_SECONDS, float(value), lambda key: label)
    return float(value)


def _grace(value: Any, label: str) -> float:
    check_grace(float(value), label)
    return float(value)


_SECONDS = Number("a number of seconds")
_FLAG = Flag()
_NAMES = Either((ListOf(Text("an inventory name")), Text("inventory names, a,b")),
                "a list of inventory names")
QUEUE = "queue"         # the groups of --help
RECOVERY = "recovery"
DOCTOR = "doctor"


@dataclass(frozen=True)
class RunSpec:
    """A run, checked (from_sources makes one); `dry_run` is not part of it: it is what
    is done with it. Each field with an Option is an option of train and a job file's
    key; the others are set by the verbs that run on train (doctor, notebook)."""

    inventory: Path = option(defaults.INVENTORY, Option(
        Text("a path"), "Ansible inventory, the one site.yml uses (default: "
        f"{defaults.INVENTORY})", flags=("--inventory", "-i"), check=_path))
    nodes: int | None = option(None, Option(        # the first N nodes of train_nodes
        Whole(), "use the first N nodes of train_nodes", group="nodes"))
    hosts: tuple[str, ...] | None = option(None, Option(   # inventory order decides node 0
        _NAMES, "use these nodes, by inventory name: a,b", group="nodes", check=_hosts,
        completes="hosts"))
    workdir: Path | None = option(None, Option(    # None: nothing to sync (a module)
        Text("a directory"), f"local directory with the training code (default: "
        f"{project().train})", special=True))
    script: str = option(defaults.SCRIPT, Option(  # relative to workdir, or a module name
        Text("a path relative to workdir"), "training script, relative to --workdir "
        f"(default: {defaults.SCRIPT})", special=True, positional=True))
    module: bool = option(False, Option(
        Text("a module name"), "run a module as `python -m MODULE` (from --workdir, or "
        "installed on the nodes) instead of a script; its arguments follow --",
        flags=("-m", "--module"), metavar="MODULE", special=True))
    script_args: tuple[str, ...] = option((), Option(
        ListOf(Text("a script argument (text or a number)", numbers=True, empty=True),
               "a list of the script's arguments"), "arguments for the script (after --)",
        key="args", special=True, positional=True))
    env: dict[str, str] = option(None, Option(
        MapOf(Text("text or a number", numbers=True, empty=True), "a mapping of NAME: value",
              null_as=""), "environment variable for the job (repeatable); its value is "
        "kept in the run's record and shown by --dry-run: for a secret, use --secret-env",
        metavar="K=V", check=_env), factory=dict)
    secret_env: tuple[str, ...] = option((), Option(   # from this shell, unrecorded
        ListOf(Text("a variable name"), "a list of variable names (their values come from "
               "the shell)"), "pass the variable NAME of this shell's environment to every "
        "rank (repeatable): its value goes to the nodes over SSH only, never into a record, "
        "a log or a command line (an API token, a password)", metavar="NAME",
        check=_secret_env))
    nproc_per_node: int | None = option(None, Option(  # None: GPUs per node, or 1 with gloo
        Either((Text("auto"), Whole()), "'auto' or a whole number"), "processes per node: "
        "a number, or auto (GPUs per node; 1 with gloo on CPU nodes) (default: auto)",
        check=_nproc, to_file=lambda v: v or "auto"))
    master_port: int | None = option(None, Option(     # None: the inventory's, moved if taken
        Whole("a port number"), "rendezvous port on node 0 (default: cluster_rendezvous_port "
        f"or {defaults.RENDEZVOUS_PORT}; another free one is picked if it is in use)",
        check=_port))
    max_restarts: int = option(defaults.MAX_RESTARTS, Option(
        Whole(), f"torchrun --max-restarts (default: {defaults.MAX_RESTARTS})",
        check=_at_least(0, "give 0 (fail on the first worker failure) or a positive number "
                        "of restarts")))
    rdzv_backend: str = option(defaults.RDZV_BACKEND, Option(
        Text("static or c10d"), "rendezvous: static (--master-addr/--master-port) or c10d "
        f"(default: {defaults.RDZV_BACKEND})", choices=("static", "c10d"),
        check=_choice("static", "c10d")))
    torchrun_args: tuple[str, ...] = option((), Option(
        ListOf(Text("a torchrun option", numbers=True), "a list of torchrun options"),
        "extra torchrun option, verbatim (repeatable), e.g. "
        "--torchrun-arg=--monitor-interval=1", key="torchrun_arg", metavar="ARG",
        check=_torchrun_args))
    runs_dir: Path = option(defaults.RUNS_DIR, Option(
        Text("a path"), f"where run records go (default: {defaults.RUNS_DIR})",
        check=_runs_dir))
    grace: float = option(defaults.GRACE, Option(
        _SECONDS, "seconds between SIGTERM and SIGKILL at teardown (default: "
        f"{defaults.GRACE:g})", check=_grace))
    detach: bool = option(False, Option(
        _FLAG, "return once the job runs on every node; the nodes supervise it (follow it "
        "with `attach RUN`, stop it with `stop RUN`)"))
    lease_timeout: float = option(defaults.LEASE_TIMEOUT, Option(
        _SECONDS, "seconds after which the nodes stop an attached run whose controller "
        "vanished without a word (killed, network cut, laptop asleep); a closed terminal or "
        f"kill -9 is noticed at once (default: {defaults.LEASE_TIMEOUT:g})",
        check=_seconds(3, "give at least 3 seconds")))
    keep_runs: int = option(defaults.KEEP_RUNS, Option(
        Whole(), "on each node, keep the code snapshots and job directories of the N newest "
        f"runs (never a live run's); 0 keeps all (default: {defaults.KEEP_RUNS})",
        metavar="N", check=_at_least(0, "give 0 (keep all) or more")))
    hang_timeout: float = option(defaults.HANG_TIMEOUT, Option(
        _SECONDS, "the run is hung when it printed nothing (no line, no beat) for S seconds: "
        "every rank's stack is then dumped and the rank that holds the others up is named "
        "(runs/RUN/hang/). Keep it below the backend's collective timeout (NCCL 10 min, gloo "
        "30 min by default), or the ranks fail before they are dumped; 0: never (default: "
        f"{defaults.HANG_TIMEOUT:g})", metavar="S",
        check=_seconds(0, "give the seconds without progress after which the run counts as "
                       "hung, as a number of 0 or more (0: never; default "
                       f"{defaults.HANG_TIMEOUT:g})")))
    gpu_idle: float = option(defaults.GPU_IDLE, Option(
        _SECONDS, "flag a GPU that did nothing (at most 1 %% used) for S seconds while the run "
        "lives: said live, kept in summary.json and the report (nvidia-smi, every 10 s); 0: "
        f"never (default: {defaults.GPU_IDLE:g})", metavar="S",
        check=_seconds(0, "give the seconds a GPU may idle before it is flagged, as a number "
                       f"of 0 or more (0: never; default {defaults.GPU_IDLE:g})")))
    on_hang: OnHang = option(OnHang.STOP, Option(
        Text("stop or wait"), "after the diagnosis of a hang: stop the run (status hung, "
        f"exit 1) or wait (keep it, keep watching) (default: {defaults.ON_HANG})",
        choices=tuple(str(o) for o in OnHang),
        check=lambda v, label: OnHang(_choice(*(str(o) for o in OnHang))(v, label))))
    python_env: str | None = option(None, Option(      # the user's own environment
        Text("the name of one of your environments (env create --name)"), "run torchrun and "
        "the workers from your own environment NAME (made with `env create --name NAME`) on "
        "every node, instead of the cluster's; preflight checks it for drift as it checks "
        "the cluster's", metavar="NAME", check=_python_env))
    share_gpus: bool = option(False, Option(  # run on nodes another run or GPU process uses
        _FLAG, "run even on nodes in use by another run (any user's, yours too) or by a "
        "process on a GPU; without it, such a node is refused, naming the user, the run and "
        "the GPUs"))
    queue: bool = option(False, Option(       # through Slurm's queue (train --queue)
        _FLAG, "ask Slurm for N nodes x G GPUs and wait in its queue (one live line: place, "
        "reason, who holds the GPUs); the run then runs on the nodes Slurm chose, each rank "
        "seeing only its GPUs, and the allocation is given back however train ends",
        group=QUEUE))
    gpus_per_node: int | None = option(None, Option(   # --queue: None, every GPU of a node
        Whole(), "GPUs per node to ask for (default: every GPU of a node)", metavar="G",
        group=QUEUE, check=_at_least(0, "give 0 or more GPUs per node")))
    partition: str | None = option(None, Option(
        Text("a Slurm partition"), "Slurm partition (default: the cluster's default)",
        group=QUEUE, check=_slurm(SLURM_NAME, "partition", "gpu")))
    time: str | None = option(None, Option(
        Text("a Slurm time limit", numbers=True), "Slurm time limit, e.g. 2:00:00 or "
        "1-00:00:00", group=QUEUE, check=_slurm(SLURM_TIME, "time", "2:00:00 or 1-00:00:00")))
    qos: str | None = option(None, Option(
        Text("a Slurm QOS"), "Slurm QOS", group=QUEUE,
        check=_slurm(SLURM_NAME, "qos", "normal")))
    max_recoveries: int = option(0, Option(   # restarts from the checkpoint after a node failed
        Whole(), "when a node fails (lost, its torchrun or supervisor killed, a rank killed by "
        "a signal), start the run again from its newest checkpoint, at most N times, on the "
        "healthy nodes and a spare; the node is cordoned. A failure of the script itself is "
        "not retried (default: 0)", metavar="N", group=RECOVERY,
        check=_at_least(0, "give 0 or more")))
    spares: int = option(0, Option(           # nodes held ready for a recovery: the next K...
        Whole(), "the K inventory nodes after the run's own, held ready for a recovery",
        metavar="K", group=RECOVERY, check=_at_least(0, "give 0 or more")))
    spare_hosts: tuple[str, ...] | None = option(None, Option(   # ...or these
        _NAMES, "these nodes held ready for a recovery (inventory names)", metavar="a,b",
        group=RECOVERY, check=_spare_hosts, completes="hosts"))
    min_nodes: int | None = option(None, Option(  # a recovery without a spare: at least this
        Whole(), "with no spare left, recover on the healthy nodes alone if they are at least "
        "M (the script must accept another world size)", metavar="M", group=RECOVERY,
        check=_at_least(1, "give 1 or more nodes")))
    doctor: bool = option(False, Option(      # run doctor first; start nothing on a suspect
        _FLAG, "run `doctor` on the nodes first and start nothing if it names a suspect",
        group=DOCTOR))
    ignore_suspects: bool = option(False, Option(
        _FLAG, "with --doctor: start the run even if doctor names suspects", group=DOCTOR))
    link_seconds: float = option(defaults.LINK_SECONDS, Option(
        _SECONDS, "doctor: seconds of traffic per direction of each link (default: "
        f"{defaults.LINK_SECONDS:g})", group=DOCTOR, check=_link_seconds))
    allreduce_mb: float = option(defaults.ALLREDUCE_MB, Option(
        Number("a number of MB"), "doctor: size of the all_reduce, in MB (default: "
        f"{defaults.ALLREDUCE_MB:g})", group=DOCTOR, check=_allreduce_mb))
    no_clean_exit: bool = option(False, Option(   # start the script itself, not the runner
        _FLAG, "start the script itself, not through the worker runner that ends each "
        "finished worker with os._exit after atexit handlers and a flush of every open file "
        "(which keeps torch's teardown from failing a finished run)"))
    run_id: str | None = option(None, Option(      # None: a new one (date, time, random)
        Text("a run id"), "the run's id, the name of its record under --runs-dir (default: "
        "a new one, from the date and time); a sweep names its trials so", metavar="ID",
        check=_run_id))
    cordoned_ok: bool = False               # doctor's own run: a cordoned node is no refusal

    @property
    def clean_exit(self) -> bool:
        """Workers start through the worker runner (`--no-clean-exit`: they do not)."""
        return not self.no_clean_exit

    @property
    def watch(self) -> HangWatch:
        return HangWatch(self.hang_timeout, self.on_hang)

    @property
    def options(self) -> TorchrunOptions:
        return TorchrunOptions(max_restarts=self.max_restarts, rdzv_backend=self.rdzv_backend,
                               extra=self.torchrun_args)

    def to_file(self) -> dict[str, Any]:
        """This spec as a job file's mapping (`train --dry-run` prints it; -f reads it)."""
        found: dict[str, Any] = {}
        for d in declared(type(self)):
            value = getattr(self, d.name)
            if d.key == "script":
                found.update({"module": self.script} if self.module else
                             {"script": self.script})
            elif d.key != "module":
                found[d.key] = d.option.to_file(value) if d.option.to_file else _plain(value)
        return found

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_file(), sort_keys=False, default_flow_style=False)


def _plain(value: Any) -> Any:
    """A field's value as a job file holds it."""
    if isinstance(value, Enum | Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


# -- the rules between options: each a check of the values by key, given where each was -----
Values = Mapping[str, Any]
Label = Callable[[str], str]


@dataclass(frozen=True)
class GoesWith:
    """KEYS (any of them given) need NEEDS (said as WHAT)."""
    keys: tuple[str, ...]
    needs: str
    what: str

    def __call__(self, values: Values, defaults_: Values, label: Label) -> None:
        given = [k for k in self.keys if values[k] != defaults_[k]]
        if given and values[self.needs] == defaults_[self.needs]:
            raise InputError(f"{label(given[0])} goes with {self.what}; add it, or leave it "
                             "out")


def _one_of_the_spares(values: Values, defaults_: Values, label: Label) -> None:
    if values["spares"] and values["spare_hosts"]:
        raise InputError(f"{label('spares')} and {label('spare_hosts')}: give one of them "
                         "(K spare nodes from the inventory's order, or these nodes)")


def _no_recovery_in_the_queue(values: Values, defaults_: Values, label: Label) -> None:
    if values["max_recoveries"] and values["queue"]:
        raise InputError(f"{label('max_recoveries')} with --queue: a run through Slurm's "
                         "queue does not recover yet (Slurm would have to grant the "
                         "spares); run without --queue, or without --max-recoveries")


def _secret_not_in_env(values: Values, defaults_: Values, label: Label) -> None:
    for name in values["secret_env"]:
        if name in values["env"]:
            raise InputError(f"{label('secret_env')} {name}: also given a value with --env; "
                             "give it once (--env values are recorded, --secret-env ones "
                             "not)")


def _arguments_fit(values: Values, defaults_: Values, label: Label) -> None:
    check_arguments_size(tuple(values["args"]), dict(values["env"]))


QUEUE_RULE = GoesWith(("gpus_per_node", "partition", "time", "qos"), "queue",
                      "--queue (a run through Slurm's queue)")
def _new_run_id(values: Values, defaults_: Values, label: Label) -> None:
    """A run id given is a new one: another run's record is not written over."""
    run_id = values.get("run_id")
    if run_id and RunDir(Path(values["runs_dir"]), run_id).run_json.exists():
        raise InputError(f"{label('run_id')} {run_id}: {values['runs_dir']} has a run of that "
                         "id already; give a new one, or leave it out for a new one")


RULES: tuple[Callable[[Values, Values, Label], None], ...] = (
    GoesWith(("ignore_suspects",), "doctor", "--doctor"),
    QUEUE_RULE,
    GoesWith(("spares", "spare_hosts", "min_nodes"), "max_recoveries",
             "--max-recoveries N (how many times a run whose node failed starts again from "
             "its checkpoint)"),
    _one_of_the_spares, _no_recovery_in_the_queue, _secret_not_in_env, _arguments_fit,
    _new_run_id,
)


# -- a job file, and the spec from it and the command line -----------------------------------
def job_keys(cls: type = RunSpec) -> dict[str, Kind]:
    """A job file's keys (CLS's options), each with its kind."""
    return {d.key: d.option.kind for d in declared(cls)}


KEYS = job_keys()
PATH_KEYS = ("inventory", "workdir", "runs_dir")


@dataclass(frozen=True)
class Given:
    """A value, and where it was given: the words an error about it begins with
    (`--nodes`, or `job.yaml line 3: nodes`)."""
    value: Any
    label: str


def option_label(key: str, cls: type = RunSpec) -> str:
    """The command-line option of a job file's key."""
    spelled = {"args": "the script's arguments", "script": "the script"}
    return spelled.get(key) or next((d.option.label for d in declared(cls) if d.key == key),
                                    f"--{key.replace('_', '-')}")


def read_job_file(path: Path, cls: type = RunSpec,
                  extra: Mapping[str, Kind] | None = None) -> dict[str, Given]:
    """A job file's keys, each with its value and where it stands; InputError naming the
    line for anything that is not a key of train (or of EXTRA: a verb's own section, such
    as a sweep's), or of the wrong kind (nested values too), or given twice, or given no
    value (`workdir:` is no default). A null is read as not given only where it is the
    option's own none (`nodes: null`: all of train_nodes), as --dry-run writes it."""
    keys = {**job_keys(cls), **(extra or {})}
    nones = frozenset(d.key for d in declared(cls)   # --dry-run writes them as null
                      if d.default is None and not d.option.special)
    record = Record(keys, hint=f"a job file takes {', '.join(keys)}. The script's own "
                    "options go in `args:`", nulls=nones)
    found: dict[str, Given] = {}
    for key, got in read_file(path, record, "a mapping of train's options (e.g. `nodes: "
                              "2`)", f"-f {path}").items():
        value = got.value
        if key in PATH_KEYS:
            value = str((path.parent / Path(value).expanduser()).absolute())
        found[key] = Given(value, f"{path} line {got.line}: {key}")
    return found


def from_sources(given: Mapping[str, Given], cls: type = RunSpec) -> Any:
    """The spec (a CLS) from the values given (a job file's, then the command line's over
    them), the defaults for the rest; InputError naming the first value that cannot be
    right, with where it was given and what would be."""
    options = declared(cls)

    def label(key: str) -> str:
        return given[key].label if key in given else option_label(key, cls)

    _refuse_empty(given, options)
    values: dict[str, Any] = {d.key: d.default for d in options}
    values.update(_what_to_run(given, label))
    for d in options:
        if d.key in given and not d.option.special:
            got = given[d.key]
            values[d.key] = d.option.check(got.value, got.label) if d.option.check else \
                got.value
    start = {d.key: d.default for d in options}
    for rule in RULES:
        rule(values, start, label)
    return cls(**{d.name: values[d.key] for d in options})


def queue_options(given: Mapping[str, Given], label: Label) -> dict[str, Any]:
    """--queue and its options, checked by train's own checks and rule (notebook takes
    them too)."""
    options = {d.key: d for d in declared(RunSpec) if d.key in ("queue", *QUEUE_RULE.keys)}
    values = {k: d.default for k, d in options.items()}
    for key, d in options.items():
        if key in given:
            got = given[key]
            values[key] = d.option.check(got.value, got.label) if d.option.check else got.value
    QUEUE_RULE(values, {k: d.default for k, d in options.items()}, label)
    return values


def _refuse_empty(given: Mapping[str, Given], options: tuple[Declared, ...]) -> None:
    """InputError for an option given as empty text (`--partition ""`): never taken for
    "not given", which would silently mean the default. (--hosts and --spare-hosts say
    it in their own words.)"""
    kinds = {d.key: d.option.kind for d in options}
    for key, got in given.items():
        if key not in ("hosts", "spare_hosts") and isinstance(got.value, str) and \
                not got.value.strip():
            raise InputError(f"{got.label} {got.value!r} is empty; give {kinds[key].what}, "
                             "or leave it out for the default")


def _what_to_run(given: Mapping[str, Given], label: Label) -> dict[str, Any]:
    """workdir, script (or -m module) and its arguments, checked."""
    def get(key: str, default: Any = None) -> Any:
        return given[key].value if key in given else default

    workdir = _workdir(get("workdir", str(project().train)), label("workdir"))
    module = get("module")
    if module is not None:
        if not MODULE_NAME.fullmatch(module):
            raise InputError(f"{label('module')} {module!r} is not a module name (dotted "
                             "Python identifiers, e.g. -m mypkg.train)")
        script = module
    else:
        script = _script(workdir, get("script") or defaults.SCRIPT)
    return {"workdir": workdir, "script": script, "module": module is not None,
            "args": tuple(str(a) for a in get("args", []))}


def check_grace(grace: float, label: str = "--grace") -> None:
    if not math.isfinite(grace) or grace < 0:
        raise InputError(f"{label} {grace}: give the seconds between SIGTERM and SIGKILL "
                         f"as a number of 0 or more (default {defaults.GRACE:g})")


def _workdir(value: str, label: str) -> Path:
    workdir = Path(value).expanduser()
    if not workdir.is_dir():
        raise InputError(f"{label} {workdir}: no such directory; point --workdir at the "
                         "directory that holds your training code")
    return workdir.resolve()


def _script(workdir: Path, script: str) -> str:
    """SCRIPT as a path relative to WORKDIR, checked to be a file in it (`../x.py` is not:
    only the work directory is copied to the nodes)."""
    inside = Path(script).resolve() if Path(script).is_absolute() else Path(
        os.path.normpath(workdir / script))
    try:
        script = str(inside.relative_to(workdir))
    except ValueError:
        raise InputError(f"script {script} is outside --workdir {workdir}; only the work "
                         "directory is copied to the nodes: move the script into it, or "
                         "point --workdir at a directory that holds it") from None
    if (workdir / script).is_dir():
        inside_py = sorted(p.name for p in (workdir / script).glob("*.py"))[:5]
        raise InputError(f"script {script!r} is a directory in {workdir}; name the "
                         "script in it" + (f" (it holds {', '.join(inside_py)})" if inside_py
                                           else "") + ", or run a package with -m")
    if not (workdir / script).is_file():
        raise InputError(f"script {script!r} not found in {workdir}; give a path "
                         "relative to --workdir (default: the repository's train/)")
    return script


# --- doctor's measurements (train --doctor, doctor) ----------------------------------------
def check_measures(link_seconds: float, allreduce_mb: float,
                   label: Callable[[str], str] = lambda key: f"--{key.replace('_', '-')}",
                   compute_seconds: float = defaults.COMPUTE_SECONDS) -> None:
    """InputError for a measurement doctor cannot make; LABEL: where each was given."""
    for key, value in (("link_seconds", link_seconds), ("compute_seconds", compute_seconds)):
        if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
            raise InputError(f"{label(key)} {value:g}: give a number above 0 and at most "
                             f"{MAX_SECONDS:g} (seconds to measure)")
    if not math.isfinite(allreduce_mb) or not 0 < allreduce_mb <= MAX_ALLREDUCE_MB:
        raise InputError(f"{label('allreduce_mb')} {allreduce_mb:g}: give a number above 0 "
                         f"and at most {MAX_ALLREDUCE_MB:g} (the all_reduce's size in MB; "
                         "every rank holds a tensor of that size)")
