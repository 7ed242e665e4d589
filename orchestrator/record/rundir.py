"""The local record of a run: runs/<run-id>/ with one log per node, run.json, summary.json.

A run's record is its owner's only, whatever the umask: run.json holds the job's command,
--env values included. Its directory is made 0700, which keeps the other users out of
every file in it, and a file written in it is made 0600 (`write_private`, `open_private`;
a directory in it, `private_dir`), so that it stays its owner's wherever it is copied or
moved. A record made before (0755 and 0644) is read as it is."""

from __future__ import annotations

import getpass
import json
import os
import re
import secrets
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, TypeVar

from ..errors import ClusterError, InputError
from .summary import NotASummary, Summary

T = TypeVar("T")


def check_owner(specs: Iterable[Any], info: dict, action: str) -> None:
    """Refuse, before any node is touched, a run of another user: on its nodes it runs as
    that user (its processes and records are theirs), unless this inventory logs in as root."""
    owners = info.get("users") or {}
    for spec in specs:
        owner, me = owners.get(spec.name), spec.ssh.effective_user()
        if owner and me not in (owner, "root"):
            raise ClusterError(f"run {info['run_id']} runs as {owner} on {spec.name}, and "
                               f"this inventory connects as {me}: only {owner} (or root on "
                               f"the node) can {action}")


class RunNotFound(ClusterError):
    """No run by that id in the runs directory."""


class RecordUnreadable(ClusterError):
    """A run's run.json or summary.json cannot be read (cut short, edited, not JSON)."""


@dataclass(frozen=True)
class Shape:
    """What the value of one key of a record must be (WHAT: in the user's words);
    REQUIRED: every writer gives it, however the run ended."""
    what: str
    fits: Callable[[Any], bool]
    required: bool = False


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _mapping(value: Any) -> bool:
    return isinstance(value, dict)


def _mappings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _or_none(fits: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or fits(value)


# What the verbs read of a run.json and a summary.json (`runs`, `runs show`, `attach`,
# `stop`, the report, `ui`): a record whose value at one of these keys is of another
# shape cannot be read, and is named so; the other keys are read where they are used.
INFO_SHAPE = {
    "run_id": Shape("text", _text),
    "inventory": Shape("the inventory's path", _text),
    "nodes": Shape("a list of node names", _texts, required=True),
    "users": Shape("a mapping of node to user", lambda v: _mapping(v) and _texts(
        list(v.values()))),
    "script": Shape("text", _text),
    "script_args": Shape("a list of text", _texts),
    "node_commands": Shape("a mapping", _mapping),
    "queued": Shape("a mapping or null", _or_none(_mapping)),
    "recovery": Shape("a mapping or null", _or_none(_mapping)),
    "recovery_plan": Shape("a mapping or null", _or_none(_mapping)),
    "master": Shape("a mapping or null", _or_none(_mapping)),
}
SUMMARY_SHAPE = {
    "status": Shape("text", _text, required=True),
    "duration_s": Shape("a number", _number, required=True),
    "nodes": Shape("a list of mappings (one a node)", _mappings),
    "first_failed": Shape("a node's name or null", _or_none(_text)),
    "recovered_in": Shape("a run id or null", _or_none(_text)),
    "hang": Shape("a mapping or null", _or_none(_mapping)),
    "recoveries": Shape("a list of mappings or null", _or_none(_mappings)),
    "step_times": Shape("a mapping or null", _or_none(_mapping)),
    "stragglers": Shape("a list or null", _or_none(lambda v: isinstance(v, list))),
    "rank_exit_codes": Shape("a mapping or null", _or_none(_mapping)),
    "error": Shape("text or null", _or_none(_text)),
    "version": Shape("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool)),
}
DOCTOR_SHAPE = {"suspects": Shape("a list of mappings (one a suspect)", _mappings)}

PRIVATE_DIR = 0o700    # a run's directory, and any directory made in it
PRIVATE_FILE = 0o600   # every file of a run's record


def private_dir(path: Path, exist_ok: bool = True) -> Path:
    """PATH made (its missing parents too, as the umask has them) and set to its owner
    only (0700), whatever the umask. EXIST_OK: one that exists already is narrowed the
    same way (else FileExistsError)."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=exist_ok)
    os.chmod(path, PRIVATE_DIR)
    return path


def open_private(path: Path, mode: str = "w") -> IO[Any]:
    """PATH opened to write ('w', 'wb') or append ('a', 'ab'), readable by its owner only
    whatever the umask: made 0600, and narrowed to 0600 if it was made wider before (a
    file of this user's; another's, root's say, keeps the mode its owner gave it)."""
    if mode not in ("w", "wb", "a", "ab"):
        raise ValueError(f"open_private: mode {mode!r}; give 'w', 'wb', 'a' or 'ab'")
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
    flags |= os.O_APPEND if mode.startswith("a") else os.O_TRUNC
    fd = os.open(path, flags, PRIVATE_FILE)
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, PRIVATE_FILE)
        return os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8")
    except BaseException:
        os.close(fd)
        raise


def write_private(path: Path, data: str | bytes) -> Path:
    """PATH replaced by DATA at once (a reader never sees half of it: written beside it as
    NAME.tmp, then renamed), readable by its owner only (`open_private`)."""
    tmp = path.with_suffix(".tmp")
    with open_private(tmp, "wb" if isinstance(data, bytes) else "w") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return path


def check_writable(path: Path, option: str) -> None:
    """ClusterError unless PATH is (or can be made as) a directory this user writes in:
    tried with a temporary directory made and removed in PATH, or in the nearest of its
    parents that exists. Nothing is left behind."""
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ClusterError(f"{option} {path}: {probe} is not a directory; choose a directory "
                           "you can write in")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".clustertrain-probe-", dir=probe))
    except OSError as exc:
        where = "" if probe == path.absolute() else f" ({probe}, where it would be made)"
        raise ClusterError(f"{option} {path} is not writable by {getpass.getuser()}{where}: "
                           f"{exc.strerror}; choose a directory you can write in") from None


def run_state_dir(shared_path: str, user: str, run_id: str) -> str:
    """Where the nodes keep a run's state on the shared filesystem: in the user's own
    directory of the share, where the loss of one node cannot lose it."""
    return f"{shared_path.rstrip('/')}/checkpoints/{user}/.clustertrain/runs/{run_id}"


# What a run's id may be: its record's directory name, and the name on its nodes.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,80}")


def check_run_id(run_id: str) -> str:
    """RUN_ID, if it is a run's id (the name of its record in the runs directory, never a
    path); InputError saying what one is, else."""
    if not RUN_ID.fullmatch(run_id):
        raise InputError(f"{run_id!r} is not a run id (a letter or digit, then up to 80 "
                         "letters, digits, '.', '_' or '-'; never a path); see `python -m "
                         "orchestrator runs` for the runs, and --runs-dir for where they are")
    return run_id


def new_run_id(now: float | None = None) -> str:
    stamp = datetime.fromtimestamp(now or time.time(), tz=timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(3)}"


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds")


def code_revision(workdir: Path) -> str | None:
    """`git describe --always --dirty` of the code directory, if it is in a git work tree."""
    try:
        out = subprocess.run(["git", "-C", str(workdir), "describe", "--always", "--dirty",
                              "--tags"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@dataclass(frozen=True)
class RunDir:
    root: Path
    run_id: str

    @property
    def path(self) -> Path:
        return self.root / self.run_id

    def log(self, node: str) -> Path:
        return self.path / f"{node}.log"

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    @property
    def summary_json(self) -> Path:
        return self.path / "summary.json"

    def create(self, info: dict[str, Any], queued: bool = False) -> None:
        """The run's directory (0700) and run.json (0600) (QUEUED: its record while it
        waited in Slurm's queue is there, and is replaced)."""
        private_dir(self.path, exist_ok=queued)
        _write_json(self.run_json, info)

    @property
    def timeline(self) -> Path:
        """The run's step times, samples/s and loss per window of its beats, one JSON
        object a line (record/progress.py `Point`), appended while it runs."""
        return self.path / "timeline.jsonl"

    @property
    def report_html(self) -> Path:
        return self.path / "report.html"

    def write_summary(self, summary: Summary) -> None:
        """The run's summary.json, the one place it is written (its report is drawn by
        whoever concludes the run: run/conclude.py `write_summary`)."""
        _write_json(self.summary_json, summary.to_json())

    @property
    def ended(self) -> bool:
        """The run has its summary: it is over (whether or not the summary reads)."""
        return self.summary_json.exists()

    def write_json(self, name: str, data: dict[str, Any]) -> Path:
        """Another record of the run (doctor.json, ...) beside its summary."""
        _write_json(self.path / name, data)
        return self.path / name

    def append_timeline(self, points: Iterable[Any]) -> None:
        """Add POINTS (progress.Point, system.Sample: anything with to_json) to the run's
        timeline."""
        lines = "".join(json.dumps(p.to_json(), separators=(",", ":")) + "\n" for p in points)
        if lines:
            with open_private(self.timeline, "a") as fh:
                fh.write(lines)

    def read_timeline(self, parse: Callable[[Any], T]) -> list[T]:
        """The timeline's lines that PARSE takes (it raises ValueError, KeyError, TypeError
        or AttributeError on a line of another kind), in order; a line that is no JSON (cut
        short by a crash) is left out too."""
        try:
            text = self.timeline.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        found = []
        for line in text.splitlines():
            try:
                found.append(parse(json.loads(line)))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        return found

    def info(self, *needs: str) -> dict[str, Any]:
        """The run's run.json (RecordUnreadable unless it reads as INFO_SHAPE says, and
        holds each key of NEEDS: what the caller cannot do without)."""
        info = self.read_json(self.run_json.name, INFO_SHAPE)
        if info is None:
            raise RecordUnreadable(f"run {self.run_id}: {self.run_json} is missing; "
                                   f"remove {self.path}/ if you no longer need the run")
        self._refuse_missing(self.run_json, info, needs)
        return info

    def summary(self) -> Summary | None:
        """The run's summary, None while it has none (it runs, or was never settled);
        RecordUnreadable naming what is wrong with one that does not read."""
        data = self.read_json(self.summary_json.name, SUMMARY_SHAPE)
        if data is None:
            return None
        try:
            return Summary.from_json(data)
        except NotASummary as exc:
            raise RecordUnreadable(f"run {self.run_id}: {self.summary_json}: {exc}; fix it, "
                                   f"or remove {self.path}/ if you no longer need the "
                                   "run") from None

    def read_json(self, name: str, shape: dict[str, Shape]) -> dict[str, Any] | None:
        """The record NAME of the run (run.json, summary.json, doctor.json, ...), None if
        there is none; RecordUnreadable naming it and what is wrong unless it is a JSON
        object whose keys have the SHAPE given (the required ones there)."""
        path = self.path / name
        data = self._read(path)
        if data is None:
            return None
        self._refuse_missing(path, data, [k for k, s in shape.items() if s.required])
        for key, want in shape.items():
            if key in data and not want.fits(data[key]):
                raise RecordUnreadable(
                    f"run {self.run_id}: {path}: {key} is {_shown(data[key])}, not "
                    f"{want.what} (edited, or cut short); fix it, or remove {self.path}/ "
                    "if you no longer need the run")
        return data

    def _refuse_missing(self, path: Path, data: dict[str, Any], keys: Iterable[str]) -> None:
        missing = [k for k in keys if k not in data]
        if missing:
            raise RecordUnreadable(
                f"run {self.run_id}: {path} lacks {', '.join(missing)} (written by an "
                f"older version, or edited); fix it, or remove {self.path}/ if you no "
                "longer need the run")

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise RecordUnreadable(
                f"run {self.run_id}: {path} cannot be read ({exc}); it was cut short or "
                f"edited: fix or remove it (the logs are beside it)") from None
        if not isinstance(data, dict):
            raise RecordUnreadable(f"run {self.run_id}: {path} is not a JSON object; fix "
                                   "or remove it")
        return data


def _shown(value: Any) -> str:
    """VALUE as a record's reader is told it: its JSON, cut to a line."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_private(path, json.dumps(data, indent=2) + "\n")


def open_run(root: Path, run_id: str) -> RunDir:
    """The run RUN_ID in ROOT (RunNotFound unless its record is there; InputError unless
    RUN_ID is a run's id: nothing outside ROOT is ever read)."""
    run = RunDir(root, check_run_id(run_id))
    if not run.run_json.exists():
        known = ", ".join(r.run_id for r in list_runs(root)[-5:]) or "none"
        raise RunNotFound(f"no run {run_id!r} in {root}/ (recent: {known}); see "
                          "`python -m orchestrator runs`, or pass --runs-dir")
    return run


def latest_attempt(run: RunDir) -> RunDir:
    """The attempt of RUN that is running now, or ran last: a run whose node failed and
    that recovered names the attempt that followed it (`recovered_in`, run/recovery.py)."""
    seen = {run.run_id}
    while True:
        try:
            summary = run.summary()
        except RecordUnreadable:
            return run
        following = summary.recovered_in if summary else None
        if not following or following in seen or not RunDir(run.root, following).run_json.exists():
            return run
        seen.add(following)
        run = RunDir(run.root, following)


def list_runs(root: Path) -> list[RunDir]:
    if not root.is_dir():
        return []
    return sorted((RunDir(root, p.name) for p in root.iterdir() if (p / "run.json").exists()),
                  key=lambda r: r.run_id)
