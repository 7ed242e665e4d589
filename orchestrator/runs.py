"""The local record of a run: runs/<run-id>/ with one log per node, run.json, summary.json."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any

from .errors import ClusterError

DEFAULT_RUNS_DIR = Path("runs")


class RunStatus(str, Enum):
    """A run's status, as `runs`, `attach` and summary.json give it."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"                    # first_failed names the node
    STOPPED = "stopped"                  # Ctrl-C in train, or `stop`
    INTERRUPTED = "interrupted"          # the controller was interrupted before the end
    CONTROLLER_LOST = "controller-lost"  # an attached run whose controller went away
    HUNG = "hung"                        # no progress for --hang-timeout: diagnosed, stopped

    def __str__(self) -> str:  # the value in f-strings and tables
        return self.value


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


def run_state_dir(shared_path: str, user: str, run_id: str) -> str:
    """Where the nodes keep a run's state on the shared filesystem: in the user's own
    directory of the share, where the loss of one node cannot lose it."""
    return f"{shared_path.rstrip('/')}/checkpoints/{user}/.clustertrain/runs/{run_id}"


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

    def create(self, info: dict[str, Any]) -> None:
        self.path.mkdir(parents=True, exist_ok=False)
        _write_json(self.run_json, info)

    def write_summary(self, summary: dict[str, Any]) -> None:
        _write_json(self.summary_json, summary)

    def write_json(self, name: str, data: dict[str, Any]) -> Path:
        """Another record of the run (doctor.json, ...) beside its summary."""
        _write_json(self.path / name, data)
        return self.path / name

    def info(self) -> dict[str, Any]:
        return json.loads(self.run_json.read_text())

    def summary(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.summary_json.read_text())
        except FileNotFoundError:
            return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def open_run(root: Path, run_id: str) -> RunDir:
    run = RunDir(root, run_id)
    if not run.run_json.exists():
        known = ", ".join(r.run_id for r in list_runs(root)[-5:]) or "none"
        raise RunNotFound(f"no run {run_id!r} in {root}/ (recent: {known}); see "
                          "`python -m orchestrator runs`, or pass --runs-dir")
    return run


def list_runs(root: Path) -> list[RunDir]:
    if not root.is_dir():
        return []
    return sorted((RunDir(root, p.name) for p in root.iterdir() if (p / "run.json").exists()),
                  key=lambda r: r.run_id)
