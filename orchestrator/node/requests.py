"""Each node verb's request, declared once: its options, their kinds and defaults. The node
parses its command line by it (`add_arguments`, `from_args`: node/__main__.py) and the
controller writes that command line from it (`argv`): nothing is declared twice, and a
request round-trips through the real node program (tests/orchestrator/node/test_requests.py).

Standard library only, as the whole node package. A field is an option `--name` (its name
with dashes) unless its metadata says `positional`; a bool is a flag (given when true); a
tuple is one comma-separated value; None is not given. `rest`: the words after `--`
(torchrun's command line, salloc's options), handed on unparsed.

Each request names its answer, the class it is a Request of (`Stop(Request[StopAnswer])`,
answers.py: the JSON object its verb prints last, and what `nodelib.ask` returns); its
ANSWER is that class, None for a verb that answers nothing (a stream of output, a process
left running, an exit status).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, cast, get_args, get_origin

from . import answers as an
from .protocol import GO, GRACE, KEEP_RUNS, LEASE_TIMEOUT, READY

_KINDS: dict[str, Any] = {"str": str, "int": int, "float": float}
R = TypeVar("R", bound="Request")
A = TypeVar("A")   # a request's answer: an answers.Answer, or None


def opt(default: Any = dataclasses.MISSING, *, help: str = "", choices: tuple[str, ...] = (),
        positional: bool = False, metavar: str | None = None) -> Any:
    """A request's field: DEFAULT (none: it is required), the HELP its verb shows."""
    meta = {"help": help, "choices": choices, "positional": positional, "metavar": metavar}
    return field(default=default, metadata=meta)


class Request(Generic[A]):
    """A node verb's request (a frozen dataclass with VERB), answered by its ANSWER: the
    class it is a Request of (`class Stop(Request[StopAnswer])`; None: no answer)."""
    VERB: ClassVar[str]
    ANSWER: ClassVar[type[an.Answer] | None] = None

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        for base in getattr(cls, "__orig_bases__", ()):
            if get_origin(base) is Request:
                [answer] = get_args(base)
                if answer is type(None):
                    cls.ANSWER = None
                elif isinstance(answer, type) and issubclass(answer, an.Answer):
                    cls.ANSWER = answer
                else:
                    raise TypeError(f"{cls.__name__} is a Request of {answer!r}: an "
                                    "answers.Answer is what a verb answers, None nothing")

    def read_answer(self, data: dict[str, Any]) -> A:
        """This request's answer in DATA, its verb's JSON object (answers.AnswerError
        naming the field that is not as ANSWER declares it)."""
        if self.ANSWER is None:
            raise TypeError(f"`node.py {self.VERB}` answers nothing to read")
        return cast(A, self.ANSWER.from_json(data))

    @classmethod
    def _fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.name != "rest"]  # type: ignore[arg-type]

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """The verb's options, as its parser takes them."""
        for f in cls._fields():
            kind, meta = _kind(f), f.metadata
            spec: dict[str, Any] = {"help": meta.get("help") or None}
            if meta.get("choices"):
                spec["choices"] = meta["choices"]
            if meta.get("metavar"):
                spec["metavar"] = meta["metavar"]
            if meta.get("positional"):
                parser.add_argument(f.name, type=kind, **spec)
                continue
            if kind is bool:
                spec["action"] = "store_true"
            else:
                spec["required"] = f.default is dataclasses.MISSING
                if kind is not tuple:
                    spec["type"] = kind
                if not spec["required"]:
                    spec["default"] = None if kind is tuple else f.default
            parser.add_argument(_flag(f.name), **spec)
        if "rest" in {f.name for f in dataclasses.fields(cls)}:  # type: ignore[arg-type]
            parser.add_argument("rest", nargs=argparse.REMAINDER)

    @classmethod
    def from_args(cls: type[R], args: argparse.Namespace) -> R:
        """The request its parser read (add_arguments)."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            value = getattr(args, f.name)
            if f.name == "rest":
                value = tuple(value[1:] if value[:1] == ["--"] else value)
            elif _kind(f) is tuple:
                value = tuple(value.split(",")) if value else ()
            values[f.name] = value
        return cls(**values)

    def argv(self) -> list[str]:
        """The words after the verb on its command line."""
        words: list[str] = []
        for f in self._fields():
            value, kind = getattr(self, f.name), _kind(f)
            if f.metadata.get("positional"):
                words.append(str(value))
            elif kind is bool:
                words += [_flag(f.name)] if value else []
            elif value is None or (kind is tuple and not value) or value == f.default:
                continue   # the node's default is the same declaration
            else:
                words += [_flag(f.name), ",".join(value) if kind is tuple else str(value)]
        rest = getattr(self, "rest", None)
        return words + (["--", *rest] if rest is not None else [])


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _kind(f: dataclasses.Field) -> Any:
    """The field's kind from its annotation (a string: annotations are postponed)."""
    text = str(f.type).replace(" | None", "").replace("None | ", "").strip()
    if text == "bool":
        return bool
    if text.startswith("tuple"):
        return tuple
    return _KINDS[text]


# -- the verbs -------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Supervise(Request[None]):   # answers nothing: its words (READY, its end), its status
    """Start torchrun for a run and watch over it (supervise.py)."""
    VERB: ClassVar[str] = "supervise"
    wait_go: bool = opt(False, help=f"say {READY}, start on {GO!r} (on stdin: it brings "
                        "the ring's key), then detach")
    in_step: bool = opt(False, help="run as a step of the run's Slurm job (srun): after GO, "
                        "go on in the foreground; SIGTERM (Slurm ends the job) ends the run")
    cwd: str | None = opt(None, help="torchrun's working directory (the code snapshot)")
    job: str = opt(help="the run's job directory on this node")
    state_dir: str = opt(help="the run's state directory on the share")
    run: str = opt(help="the run's id")
    node: str = opt(help="this node's inventory name")
    nodes: tuple[str, ...] = opt(help="every node of the run, in rank order")
    addresses: tuple[str, ...] = opt((), help="each node's cluster address, in --nodes' "
                                     "order (the ring's beats go there; default: the names)")
    grace: float = opt(GRACE, help="seconds between SIGTERM and SIGKILL at a stop")
    lease_timeout: float = opt(LEASE_TIMEOUT, help="an attached run's lease (seconds)")
    keep_runs: int = opt(KEEP_RUNS, help="prune all but the KEEP_RUNS newest runs' "
                         "snapshots and job dirs (0: keep all)")
    attached: bool = opt(False, help="stop the job when the controller's lease runs out")
    hang_timeout: float = opt(0.0, help="seconds without progress on every node after "
                              "which the run is hung (0: never)")
    on_hang: str = opt("stop", choices=("stop", "wait"))
    recovery: bool = opt(False, help="a detached run that may recover: a peer's fault "
                         "starts the next attempt (recover.py)")
    ring_ports: str | None = opt(None, help="LOW-HIGH: the ring's UDP port is the first "
                                 "free one of these (the cluster's ring ports)")
    key_file: str | None = opt(None, help="without --wait-go: the run's ring key (hex)")
    rest: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Follow(Request[None]):   # answers nothing: the run's output, then the exit marker
    """Print a run's output as it grows, ending with the exit marker (follow.py)."""
    VERB: ClassVar[str] = "follow"
    job: str = opt(help="the run's job directory on this node")
    tail: int | None = opt(None, help="its last TAIL lines first")
    from_line: int = opt(0, help="from line FROM_LINE + 1 on")
    lease: bool = opt(False, help="standard input carries the controller's heartbeat")


@dataclass(frozen=True)
class Stop(Request[an.StopAnswer]):
    """Stop a run's processes on this node (terminate.py)."""
    VERB: ClassVar[str] = "stop"
    jobs: str = opt(positional=True, help="the jobs directory, relative to the home")
    run: str = opt(positional=True)
    grace: float = opt(positional=True)


@dataclass(frozen=True)
class Dump(Request[an.DumpAnswer]):
    """Every worker's stack and flight recorder, as JSON (dump.py)."""
    VERB: ClassVar[str] = "dump"
    jobs: str = opt(positional=True, help="the jobs directory, relative to the home")
    run: str = opt(positional=True)
    py_spy: str = opt(positional=True)
    native: bool = opt(False, help="native frames too")


@dataclass(frozen=True, kw_only=True)
class Standby(Request[None]):   # answers nothing: STARTED, then its own log
    """A spare of a detached run that may recover: waits for its place (recover.py)."""
    VERB: ClassVar[str] = "standby"
    plan: str = opt(help="the run's recovery plan on the share")
    node: str = opt(help="this spare's inventory name")
    torchrun: str = opt(help="this node's torchrun")
    log: str = opt(help="the standby's own words")
    detach: bool = opt(False, help="go on in a session of its own")


@dataclass(frozen=True)
class RecoveryPlan(Request[None]):   # answers nothing: its exit status
    """Write a detached run's recovery plan on the share (JSON on stdin)."""
    VERB: ClassVar[str] = "recovery-plan"
    path: str = opt(positional=True, help="where the plan goes")


@dataclass(frozen=True)
class Probe(Request[an.ProbeAnswer]):
    """Preflight's round 1: this node as it is now (preflight.py; the request on stdin)."""
    VERB: ClassVar[str] = "probe"


@dataclass(frozen=True)
class Reach(Request[an.ReachAnswer]):
    """Preflight's round 2: node 0's token and master port (preflight.py; stdin)."""
    VERB: ClassVar[str] = "reach"


@dataclass(frozen=True)
class Unlisten(Request[None]):   # answers nothing: its exit status
    """End node 0's preflight listener (preflight.py)."""
    VERB: ClassVar[str] = "unlisten"
    port: int = opt(positional=True)
    nonce: str = opt(positional=True)


@dataclass(frozen=True)
class Release(Request[None]):   # answers nothing: its exit status
    """Drop the master-port claim of a run (preflight.py)."""
    VERB: ClassVar[str] = "release"
    run: str = opt(positional=True)
    once_bound: int | None = opt(None, metavar="PORT", help="first wait until PORT is "
                                 "bound (at most BOUND_WAIT seconds)")


@dataclass(frozen=True)
class Busy(Request[an.Busy]):
    """This node's live runs (any user's) and GPU processes, as JSON (busy.py)."""
    VERB: ClassVar[str] = "busy"
    exclude: str | None = opt(None, metavar="RUN", help="leave this run out (the one "
                              "launched)")


@dataclass(frozen=True, kw_only=True)
class Envs(Request[an.EnvsAnswer]):
    """The user's own environments here, as JSON; --rm and --prune remove (envs.py)."""
    VERB: ClassVar[str] = "envs"
    name: str | None = opt(None, help="only this environment's states")
    rm: bool = opt(False, help="remove them (none while in use)")
    key: str | None = opt(None, help="with --rm: only this state")
    prune: int | None = opt(None, metavar="KEEP", help="remove the states of --name "
                            "beyond the KEEP newest (unused ones)")


@dataclass(frozen=True, kw_only=True)
class Allocate(Request[None]):   # answers nothing: a stream of events, one JSON a line
    """Hold a Slurm allocation while the controller's connection lives (allocate.py)."""
    VERB: ClassVar[str] = "allocate"
    name: str = opt(help="the Slurm job's name")
    gpus_per_node: str = opt("all", help="G, or all (the default)")
    rest: tuple[str, ...] = ()   # salloc's options


@dataclass(frozen=True)
class States(Request[an.StatesAnswer]):
    """The run's node states, hang dumps and recovery decision on the share (states.py)."""
    VERB: ClassVar[str] = "states"
    state_dir: str = opt(positional=True)


@dataclass(frozen=True)
class Cordon(Request[an.CordonAnswer]):
    """Add a node's cordon or uncordon to the share's record, or list (cordon.py; stdin)."""
    VERB: ClassVar[str] = "cordon"


@dataclass(frozen=True, kw_only=True)
class Health(Request[an.HealthAnswer]):
    """This node's health verdict; with --share, every node's history (health.py)."""
    VERB: ClassVar[str] = "health"
    share: str | None = opt(None, help="read every node's history and cordons there too")
    since: float = opt(0.0, help="seconds since the epoch")
    admin_group: str | None = opt(None)


@dataclass(frozen=True)
class Du(Request[an.DuAnswer]):
    """The share's bytes by owner and kind, as JSON (du.py)."""
    VERB: ClassVar[str] = "du"
    share: str = opt(positional=True)


@dataclass(frozen=True)
class Usage(Request[an.UsageAnswer]):
    """Node- and GPU-hours per user and run from the records on the share (usage.py)."""
    VERB: ClassVar[str] = "usage"
    share: str = opt(positional=True)
    since: float = opt(0.0, help="seconds since the epoch")
    sacct: bool = opt(False, help="Slurm's accounting too (sacct.py)")


@dataclass(frozen=True)
class Torch(Request[an.TorchAnswer]):
    """Import torch in this Python and say what it sees (fingerprint.py)."""
    VERB: ClassVar[str] = "torch"


@dataclass(frozen=True)
class Carry(Request[an.CarryAnswer]):
    """What a job wrote in its working directory, into the next run's (carry.py)."""
    VERB: ClassVar[str] = "carry"
    code_root: str = opt(positional=True, help="~/.clustertrain/code")
    run: str = opt(positional=True)
    key: str = opt(positional=True, help="the work directory's (its digest)")
