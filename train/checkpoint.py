"""Crash-safe checkpoints on shared storage.

A checkpoint is written to a temporary file in the same directory, flushed and
fsync'ed, renamed over its final name (atomic within one directory), and the
directory is fsync'ed so that the rename itself survives a crash. A reader
therefore sees either a complete checkpoint under a final name or none at all;
a killed writer leaves only a `.tmp` file, which is ignored and cleaned up.
Loading uses `torch.load(weights_only=True)`: a checkpoint holds tensors, numbers,
strings, lists, tuples and dicts, never pickled code.

`CheckpointStore` keeps the files of one run; `Checkpointer` saves any object with
`state_dict()`/`load_state_dict()` (a `Stateful`, such as the job's Trainer) into a
store and restores the newest checkpoint into it, reading that one file once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

FORMAT = "clustertrain-ckpt-1"
_NAME = re.compile(r"^ckpt-(\d{6})-(\d{7})\.pt$")
_TMP_MARK = ".tmp-"


@dataclass(frozen=True, order=True)
class Position:
    """Where training stands: `epoch` is the epoch to run next (or to continue),
    `step` the number of its batches already done (0 at an epoch boundary)."""

    epoch: int
    step: int = 0

    def filename(self) -> str:
        return f"ckpt-{self.epoch:06d}-{self.step:07d}.pt"


class Stateful(Protocol):
    """What a checkpointer saves: its `state_dict()` holds `epoch` and `step`, which name
    the checkpoint, and anything else that `torch.load(weights_only=True)` reads back."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RestoreError(Exception):
    """A checkpoint could be read but not restored into the object (other settings)."""


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some network file systems refuse fsync on a directory; the rename stands
    finally:
        os.close(fd)


class CheckpointStore:
    """The checkpoints of one run, in one directory, of which the newest `keep` are kept."""

    def __init__(self, directory: Path, keep: int = 3,
                 log: Callable[[str], None] = lambda _msg: None) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1 (the newest checkpoint is always kept)")
        self.directory = Path(directory)
        self.keep = keep
        self.log = log

    # -- listing ----------------------------------------------------------------------
    def positions(self) -> list[tuple[Position, Path]]:
        """Final-named checkpoints, oldest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for entry in self.directory.iterdir():
            m = _NAME.match(entry.name)
            if m:
                found.append((Position(int(m.group(1)), int(m.group(2))), entry))
        return sorted(found)

    # -- writing ----------------------------------------------------------------------
    def save(self, state: dict[str, Any], pos: Position) -> Path:
        """Write `state` durably as the checkpoint for `pos`, then prune old ones.

        Old ones are pruned before the write too: a writer killed between its rename
        and its prune leaves one extra, which the next save removes before adding
        its own, so the directory never holds more than `keep` + 1."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.prune()
        final = self.directory / pos.filename()
        tmp = self.directory / f".{pos.filename()}{_TMP_MARK}{os.getpid()}"
        payload = dict(state, format=FORMAT, epoch=pos.epoch, step=pos.step)
        try:
            with open(tmp, "wb") as f:
                torch.save(payload, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.directory)
        self.prune()
        return final

    def prune(self) -> None:
        """Remove all but the newest `keep` checkpoints."""
        existing = self.positions()
        for _pos, path in existing[:-self.keep]:
            path.unlink(missing_ok=True)

    def remove_stale_temps(self) -> int:
        """Delete `.tmp` files left by writers that were killed; call before writing starts."""
        if not self.directory.is_dir():
            return 0
        removed = 0
        for entry in self.directory.iterdir():
            if entry.name.startswith(".ckpt-") and _TMP_MARK in entry.name:
                entry.unlink(missing_ok=True)
                removed += 1
        return removed

    # -- reading ----------------------------------------------------------------------
    @staticmethod
    def load(path: Path) -> dict[str, Any]:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"{path} is not a {FORMAT} checkpoint")
        return state

    def latest(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that loads, or None. Damaged ones are reported and skipped."""
        for _pos, path in reversed(self.positions()):
            try:
                return path, self.load(path)
            except Exception as exc:  # noqa: BLE001 - any damage means: try the previous one
                self.log(f"checkpoint {path} cannot be loaded ({exc}); trying an older one")
        return None


def _alone(value: str | None) -> str | None:
    return value


@dataclass
class Checkpointer:
    """Saves a Stateful object into `store` and restores it from there.

    In a job of several processes every process calls `save` and `restore` (the
    object's `state_dict` may be collective): the `main` process alone writes, and
    chooses the checkpoint to restore, which `share` (main's value, on every process)
    hands to the others. Each process then reads that one file once.
    """

    store: CheckpointStore
    main: bool = True
    share: Callable[[str | None], str | None] = _alone

    def save(self, obj: Stateful) -> Path | None:
        """Write `obj`'s state as the checkpoint of its position (None on other processes)."""
        state = obj.state_dict()
        if not self.main:
            return None
        return self.store.save(state, Position(int(state["epoch"]), int(state["step"])))

    def restore(self, obj: Stateful) -> Path | None:
        """Load the newest complete checkpoint into `obj`; its path, or None if there is none."""
        found = self.store.latest() if self.main else None  # main reads it here, once
        chosen = self.share(str(found[0]) if found else None)
        if chosen is None:
            return None
        path = Path(chosen)
        state = found[1] if found is not None else self.store.load(path)
        try:
            obj.load_state_dict(state)
        except ValueError as exc:
            raise RestoreError(f"checkpoint {path} {exc}") from exc
        return path
