"""What a run keeps from every other user: the key its supervisors prove their beats with
(node/ring.py) and the values of its `--secret-env` variables. Both are made or read
when the run is planned, live in this process's memory, and reach the nodes only over
each node's SSH session's input (the launch's GO: node/protocol.GoWord); a detached run
that may recover also keeps them in its recovery plan, a file only its user can read
(node/recover.py). Never on a command line, in an environment another user can read, in
the run's record or in a log."""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..node.protocol import RING_KEY_BYTES as KEY_BYTES


@dataclass(frozen=True)
class RunSecrets:
    key: bytes = field(default_factory=lambda: secrets.token_bytes(KEY_BYTES), repr=False)
    env: dict[str, str] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:   # a traceback or a debug print shows the names only
        return f"RunSecrets(env={sorted(self.env)})"

    @classmethod
    def of(cls, names: Sequence[str]) -> RunSecrets:
        """A new key, and the value of each of NAMES (the spec's secret_env, checked to be
        set) from this process's environment."""
        return cls(env={n: os.environ[n] for n in names})

    def for_plan(self) -> dict[str, object]:
        """What a detached run's recovery plan keeps of them (node/recover.py reads it)."""
        return {"key": self.key.hex(), "secret_env": dict(self.env)}
