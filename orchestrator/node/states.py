"""A run's state on the share, read on one node for the controller (`runs`, `attach`):
each node's state file (STATE/<node>.json, written by its supervisor) and each node's
hang dumps (STATE/hang/<node>.json), with this node's clock, and a detached run's recovery
decision (STATE/recovery/next.json: node/recover.py)."""

from __future__ import annotations

import glob
import os
import time

from .protocol import HANG_SUBDIR, NEXT_FILE, RECOVERY_SUBDIR
from .util import read_json


def _read_all(pattern: str) -> dict[str, dict]:
    found = {}
    for path in glob.glob(pattern):
        data = read_json(path)
        if isinstance(data, dict):
            found[os.path.basename(path)[:-len(".json")]] = data
    return found


def read_states(state_dir: str) -> dict:
    return {"now": time.time(), "states": _read_all(os.path.join(state_dir, "*.json")),
            "hang": _read_all(os.path.join(state_dir, HANG_SUBDIR, "*.json")),
            "next": read_json(os.path.join(state_dir, RECOVERY_SUBDIR, NEXT_FILE))}
