"""Each node verb's answer, declared once: the JSON object a verb prints on the last line of
its output. The node builds it and prints `to_json` (__main__.py), the controller reads it
back (`from_json`, through nodelib.ask): both ends read the same declaration. A request
names its answer: `class Stop(Request[StopAnswer])` (requests.py; its ANSWER).

Standard library only, as the whole node package. A field is the key of its name (or its
metadata's `key`: `from` is no name in Python); a field with a default may be left out,
one without must be there. `from_json` checks each value against the field's annotation
(str, int, float, bool, None, list, dict, a dataclass, a union of these, Any) and raises
AnswerError naming the first field that is missing or of the wrong kind. A field kept a
dict of Any says why: what it holds is declared elsewhere (a role's file, which cannot
import the package), or is facts the controller reads as they come.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

T = TypeVar("T", bound="Answer")


class AnswerError(ValueError):
    """An answer that is not its declaration's shape: FIELD (a path, as ranks[0].pid) and
    WHY (is missing, or what it is instead of what it should be)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field} {why}")
        self.field = field
        self.why = why


class Answer:
    """A node verb's answer (a dataclass): written by the node, read by the controller."""

    def to_json(self) -> dict[str, Any]:
        data = _plain(self)
        assert isinstance(data, dict)
        return data

    @classmethod
    def from_json(cls: type[T], data: Any) -> T:
        """The answer in DATA (a verb's JSON object), checked against its fields."""
        if not isinstance(data, dict):
            raise AnswerError("the answer", f"is {_what(data)}, not an object")
        return typing.cast(T, _record(cls, data, ""))


def _key(f: dataclasses.Field) -> str:
    return str(f.metadata.get("key", f.name))


def _plain(value: Any) -> Any:
    """VALUE as JSON holds it: a dataclass as an object of its fields' keys."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {_key(f): _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _record(cls: type, data: dict[str, Any], at: str) -> Any:
    """An instance of dataclass CLS from DATA (at AT in the answer)."""
    hints, values = _hints(cls), {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = _key(f)
        here = f"{at}.{key}" if at else key
        if key in data:
            values[f.name] = _load(hints[f.name], data[key], here)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise AnswerError(here, "is missing")
    return cls(**values)


def _load(kind: Any, value: Any, at: str) -> Any:
    """VALUE as KIND declares it; AnswerError naming AT when it is not one."""
    if typing.get_origin(kind) in (Union, types.UnionType):
        choice = next((k for k in typing.get_args(kind) if _fits(k, value)), None)
        if choice is None:
            raise AnswerError(at, f"is {_what(value)}, not {_name(kind)}")
        return _load(choice, value, at)
    if not _fits(kind, value):
        raise AnswerError(at, f"is {_what(value)}, not {_name(kind)}")
    base, args = typing.get_origin(kind) or kind, typing.get_args(kind)
    if base is list:
        return [_load(args[0] if args else Any, v, f"{at}[{i}]") for i, v in enumerate(value)]
    if base is dict:
        return {k: _load(args[1] if args else Any, v, f"{at}[{k!r}]") for k, v in value.items()}
    if dataclasses.is_dataclass(base):
        return _record(typing.cast(type, base), value, at)
    return float(value) if base is float else value


def _fits(kind: Any, value: Any) -> bool:
    """Whether VALUE is of KIND's JSON kind (its items are checked by _load)."""
    if kind is Any:
        return True
    if kind is type(None):
        return value is None
    base = typing.get_origin(kind) or kind
    if dataclasses.is_dataclass(base):
        return isinstance(value, dict)
    if base in (int, float):   # JSON's true and false are no numbers
        return isinstance(value, (int, float) if base is float else int) \
            and not isinstance(value, bool)
    return isinstance(value, base)


def _name(kind: Any) -> str:
    """KIND as the error names it: int, list[RankDump], str or null."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (Union, types.UnionType):
        return " or ".join(map(_name, args))
    if kind is type(None) or kind is Any:
        return "null" if kind is type(None) else "Any"
    base = typing.get_origin(kind) or kind
    inner = f"[{', '.join(map(_name, args))}]" if args else ""
    return getattr(base, "__name__", str(base)) + inner


def _what(value: Any) -> str:
    """What VALUE is, in JSON's words, shortly."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a bool ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    return "a list" if isinstance(value, list) else "an object"


# -- stop, dump ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StopAnswer(Answer):
    """What `stop` did to a run's processes on the node (terminate.py stop_tree)."""
    found: bool            # a job record, or a supervisor starting, of the run
    user: str              # who the stop ran as
    killed: list[int]      # PIDs that needed SIGKILL after the grace period
    left: list[int]        # PIDs still alive afterwards (should be none)
    initial: list[int] = field(default_factory=list)   # the run's processes at the start
    pgid: int | None = None    # its torchrun's process group (None: none recorded)
    stale: bool = False        # the recorded group is another program's: nothing signalled


@dataclass(frozen=True)
class RankDump:
    """One worker's dump (dump.py dump_workers): its py-spy DUMP (JSON text) or ERROR, and
    its flight recorder FR (base64 of zlib of torch's pickle) or FR_ERROR."""
    rank: int
    pid: int
    dump: str | None = None
    error: str | None = None
    fr: str | None = None
    fr_error: str | None = None


@dataclass(frozen=True)
class DumpAnswer(Answer):
    """`dump`: each worker of the run on the node (none: no worker runs there)."""
    ranks: list[RankDump]


# -- preflight: probe, reach -----------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    """One check's outcome: whether it held, else why not."""
    ok: bool
    error: str | None = None


@dataclass(frozen=True)
class ReachAnswer(Answer):
    """Round 2 of preflight on a node (preflight.py reach; reach_ahead, at the end of its
    probe, says where it connected: ADDR, PORT); `reach` with "stop" (node 0's listener
    ended: stop_listener) answers STOPPED and STRANGERS. ERROR: the check could not be made
    (the controller's word, when the node gave no answer)."""
    token: Check | None = None      # node 0's token, read on this node's share
    connect: Check | None = None    # node 0's listener on the master port, connected to
    # who connected to the listener without the run's key: {"addr", "said"}, its words
    strangers: list[dict[str, str]] = field(default_factory=list)
    seconds: float | None = None
    addr: str | None = None
    port: int | None = None
    stopped: bool | None = None
    error: str | None = None


@dataclass(kw_only=True)
class ProbeAnswer(Answer):
    """Round 1 of preflight: the node as it is now (preflight.py probe). Every field has a
    default, and it is no frozen one: the controller's NodeFacts (checks/probe.py) is this
    answer with the node it came from, and a node that could not be probed has none of
    it; preflight adds round 2's REACH to it. The facts kept dicts are read by preflight as
    they come: the fingerprints are fingerprint.py's (a role's file), the verdict and the
    cordon health.py's and cordon.py's (the same), the rest the probe's own words."""
    user: str | None = None          # who the job runs as on this node
    uid: int | None = None
    home: str | None = None
    machine: dict[str, str] | None = None   # preflight.py machine(): what tells machines apart
    fingerprint: dict[str, Any] | None = None   # the environment as it is now
    fingerprint_error: str | None = None
    provisioned: dict[str, Any] | None = None   # fingerprint.json, written at provisioning
    provisioned_error: str | None = None
    python_env: dict[str, Any] | None = None
    python_env_error: str | None = None
    env_dir: str | None = None       # a user's own environment: its NAME-KEY directory
    cluster_env: dict[str, str] = field(default_factory=dict)
    torch: dict[str, Any] = field(default_factory=dict)
    gpu_count: int | None = None     # GPUs the driver shows (no torch), None: not read
    gpu_source: str | None = None
    busy: Busy | None = None                    # other runs, GPU processes
    cordon: dict[str, Any] | None = None        # cordon.py: this node's cordon, if any
    health: dict[str, Any] | None = None        # health.py: its health check's failing verdict
    health_warnings: list[str] = field(default_factory=list)   # what it said, not cordoned for
    shared: dict[str, Any] = field(default_factory=dict)
    space: list[dict[str, Any]] = field(default_factory=list)  # space.py space()
    share_users: dict[str, Any] | None = None  # health.py read_users(): who fills it
    port_free: bool | None = None
    free_port: int | None = None
    port_error: str | None = None
    port_warning: str | None = None  # the port was found free but could not be claimed
    listener: dict[str, Any] | None = None      # node 0: the master-port listener
    reach: ReachAnswer | None = None            # round 2: token seen, master port reached
    resolve: dict[str, str | None] = field(default_factory=dict)  # cluster address -> IP
    seconds: float | None = None       # how long the probe ran on the node
    time: float | None = None          # the node's clock at its end


# -- busy ----------------------------------------------------------------------------------
@dataclass
class GpuProcess:
    """A process with a context on a GPU (a row of `nvidia-smi --query-compute-apps`)."""
    pid: int
    uuid: str
    gpu: int | None = None        # the GPU's index (None: not among nvidia-smi's GPUs)
    used_mib: int | None = None   # None: nvidia-smi says [N/A]
    user: str | None = None       # None: not visible here (another container's, say)
    command: str = ""
    slurm_job: str | None = None  # the Slurm job it is a step of (None: none seen)


@dataclass
class LiveRun:
    """A run with a live supervisor on this node: its id, owner, supervisor PIDs and the
    GPUs its processes hold."""
    run: str
    user: str
    pids: list[int] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    kind: str = "run"     # "notebook": `clustertrain notebook`'s JupyterLab
    slurm_job: str | None = None   # its supervisor a step of this Slurm job (--queue)


@dataclass(frozen=True)
class Busy(Answer):
    """`busy` (busy.py scan): the node's other users: runs, and GPU processes of no run.
    HIDDEN: this user cannot see other users' processes (/proc mounted with hidepid).
    ERROR: nvidia-smi failed, so whether the GPUs are in use is not known."""
    runs: list[LiveRun] = field(default_factory=list)
    gpu_processes: list[GpuProcess] = field(default_factory=list)
    hidden: bool = False
    error: str | None = None


# -- envs ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeEnv:
    """One state (NAME-KEY/) of a user's environment on the node (envs.py describe)."""
    name: str
    key: str
    dir: str
    current: bool           # NAME points at it
    complete: bool          # False: an `env create` that did not finish
    backend: str | None
    fingerprint: str        # the first 12 digits of its fingerprint ("": none)
    packages: int
    size: int               # bytes
    last_used: float | None
    in_use: list[int]       # the user's processes that run from it


@dataclass(frozen=True)
class EnvsAnswer(Answer):
    """`envs`: a listing fills ROOT, ENVS and NOW (envs.py list_envs); --rm and --prune fill
    REMOVED (the directories removed) and IN_USE ({directory: PIDs} that kept a removal
    from happening: then nothing was removed)."""
    root: str = ""
    envs: list[NodeEnv] = field(default_factory=list)
    now: float = 0.0
    removed: list[str] = field(default_factory=list)
    in_use: dict[str, list[int]] = field(default_factory=dict)


# -- states, cordon, health ------------------------------------------------------------------
@dataclass(frozen=True)
class StatesAnswer(Answer):
    """`states`: what the nodes of a run left on the share, as one node read it (states.py).
    Each node's state and hang dumps are as its supervisor wrote them, and the recovery
    decision as recover.py did: records of their own, read as they come."""
    states: dict[str, dict[str, Any]]   # node -> its state (running, with a heartbeat; or ended)
    now: float                          # that node's clock
    hang: dict[str, dict[str, Any]] = field(default_factory=dict)   # node -> its hang dumps
    # A detached run that may recover: the nodes' decision of its next attempt, if any.
    next: dict[str, Any] | None = None


@dataclass(frozen=True)
class CordonAnswer(Answer):
    """`cordon` (cordon.py main): a listing fills CORDONED and IGNORED; an event EVENT (an
    uncordon LIFTED and HELD too: the cordons it lifted, and others' that still hold); an
    uncordon this user may not make REFUSED, why; a record that cannot be written ERROR.
    The events and cordons are cordon.py's (a role's file, which cannot import this
    package), as its Event.to_json writes them."""
    cordoned: dict[str, dict[str, Any]] = field(default_factory=dict)   # node -> its cordon
    ignored: list[dict[str, str]] = field(default_factory=list)   # {"file", "by", "why"}
    event: dict[str, Any] | None = None
    lifted: list[dict[str, Any]] = field(default_factory=list)
    held: list[dict[str, Any]] = field(default_factory=list)
    refused: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class HealthAnswer(Answer):
    """`health`: the node's verdict (its health check's state.json, None: the check never
    ran here); with --share, every node's history lines, the runs that lost each node and
    the cordons now (health.py nodes_view). All of it health.py's and cordon.py's records
    (roles' files, which cannot import this package)."""
    state: dict[str, Any] | None
    history: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    runs_failed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    cordoned: dict[str, dict[str, Any]] = field(default_factory=dict)


# -- du, usage -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Unread:
    """A place on the share that was not read, or a record not counted, and why."""
    path: str
    owner: str
    why: str


@dataclass(frozen=True)
class DuAnswer(Answer):
    """`du` (du.py usage): the share's room and its bytes by owner and kind."""
    share: str
    free: int | None
    total: int | None
    users: dict[str, dict[str, int]]   # user -> {kind (du.py KINDS): bytes}
    unread: list[Unread]


@dataclass(frozen=True)
class RunUsage:
    """One run's use inside the window (usage.py)."""
    run: str
    user: str
    nodes: list[str]
    start: float
    end: float | None     # None: still running
    node_hours: float
    gpu_hours: float
    idle_gpu_hours: float


@dataclass(frozen=True)
class UserUsage:
    """One user's runs inside the window, summed."""
    runs: int
    node_hours: float
    gpu_hours: float
    idle_gpu_hours: float


@dataclass(frozen=True)
class LedgerUsage:
    """The part of a user's figures their usage ledger gave (ledger.py): the runs folded
    away, counted by the UTC days FIRST_DAY to LAST_DAY inside the window."""
    runs: int
    node_hours: float
    gpu_hours: float
    idle_gpu_hours: float
    first_day: str
    last_day: str


@dataclass(frozen=True)
class SlurmUser:
    """One user's allocations in Slurm's accounting (sacct.py)."""
    jobs: int
    node_hours: float
    gpu_hours: float


@dataclass(frozen=True)
class SlurmUsage:
    """Slurm's accounting of the window (sacct.py slurm_usage): by user, or ERROR."""
    users: dict[str, SlurmUser]
    error: str | None


@dataclass(frozen=True)
class UsageAnswer(Answer):
    """`usage` (usage.py usage): node- and GPU-hours per run and user from SINCE on, the
    runs whose GPUs sat IDLE, what was not read or counted; the part of USERS that the
    users' ledgers gave (LEDGER: folded runs, by the day); with --sacct, Slurm's word."""
    since: float
    runs: list[RunUsage]
    users: dict[str, UserUsage]
    idle: list[RunUsage]
    unread: list[Unread]
    refused: list[Unread]
    ledger: dict[str, LedgerUsage] = field(default_factory=dict)
    slurm: SlurmUsage | None = None


# -- torch, carry --------------------------------------------------------------------------
@dataclass(frozen=True)
class TorchAnswer(Answer):
    """`torch` (fingerprint.py checks): what importing torch in this Python shows."""
    torch_import: str | None   # "ok", or why it failed
    version: str | None
    distributed: bool
    nccl: bool
    cuda_available: bool
    gpu_count: int
    pci_gpus: int
    driver_gpus: int


@dataclass(frozen=True)
class CarryAnswer(Answer):
    """`carry` (carry.py): what the last run from the same work directory (FROM_, None: no
    such run) wrote, carried into this run's snapshot (CARRIED), or kept the code's own
    version of (KEPT_CODE); COPIED: copied, not linked (that run still runs)."""
    from_: str | None = field(metadata={"key": "from"})
    carried: list[str]
    kept_code: list[str]
    copied: bool
