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

from ..errors import ClusterError

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


# What a summary.json must hold to be read (`runs`, `runs show`, `attach`); every writer
# gives these and more (start, end, nodes, first_failed), however the run ended.
SUMMARY_KEYS = ("status", "duration_s")

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
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")


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
        object a line (diagnosis/progress.py `Point`), appended while it runs."""
        return self.path / "timeline.jsonl"

    @property
    def report_html(self) -> Path:
        return self.path / "report.html"

    def write_summary(self, summary: dict[str, Any]) -> None:
        """The run's summary.json (its report is drawn by whoever concludes the run:
        run/status.py `write_summary`)."""
        _write_json(self.summary_json, summary)

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

    def info(self) -> dict[str, Any]:
        info = self._read(self.run_json)
        if info is None:
            raise RecordUnreadable(f"run {self.run_id}: {self.run_json} is missing")
        return info

    def summary(self) -> dict[str, Any] | None:
        """The run's summary, None while it has none (it runs, or was never settled)."""
        summary = self._read(self.summary_json)
        if summary is not None:
            missing = [k for k in SUMMARY_KEYS if k not in summary]
            if missing:
                raise RecordUnreadable(
                    f"run {self.run_id}: {self.summary_json} lacks {', '.join(missing)} "
                    "(written by an older version, or edited); fix it, or remove "
                    f"{self.path}/ if you no longer need the run")
        return summary

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


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_private(path, json.dumps(data, indent=2) + "\n")


def open_run(root: Path, run_id: str) -> RunDir:
    run = RunDir(root, run_id)
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
        following = (summary or {}).get("recovered_in")
        if not following or following in seen or not RunDir(run.root, following).run_json.exists():
            return run
        seen.add(following)
        run = RunDir(run.root, following)


def list_runs(root: Path) -> list[RunDir]:
    if not root.is_dir():
        return []
    return sorted((RunDir(root, p.name) for p in root.iterdir() if (p / "run.json").exists()),
                  key=lambda r: r.run_id)
