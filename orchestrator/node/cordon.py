"""The cordon record: which nodes every user's runs keep out, on the share where every node
reads it (SHARE/cordons/, made by the nfs_server role: sticky and world-writable, like
/tmp, so that each user adds files and nobody removes another's).

The record is a log of events, one file each, never changed: `NODE@TIME_NS@USER.json`,
{"node", "action": "cordon"|"uncordon", "why", "by", "since", "time", "run"}. A node's
newest event decides: it is cordoned while that event is a cordon. Writing a new file is
the only write, so two users never lose each other's event, and nothing needs a lock.
"""

from __future__ import annotations

import getpass
import json
import os
import time
from datetime import datetime, timezone
from typing import Any

CORDONS_SUBDIR = "cordons"   # under the share's root (nfs_server_subdirectories)
CORDON, UNCORDON = "cordon", "uncordon"


class NoRecord(Exception):
    """The share has no cordon directory (made by site.yml's nfs_server role)."""


def cordons_dir(share: str) -> str:
    return os.path.join(share, CORDONS_SUBDIR)


def events(share: str, node: str | None = None) -> list[dict[str, Any]]:
    """Every event (of NODE), oldest first; a file that does not read is left out (a
    writer's temporary file, or one cut short)."""
    where = cordons_dir(share)
    try:
        names = os.listdir(where)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        if node is not None and not name.startswith(f"{node}@"):
            continue
        try:
            with open(os.path.join(where, name), encoding="utf-8") as fh:
                event = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(event, dict) and event.get("node") and isinstance(
                event.get("time"), (int, float)):
            found.append(event)
    return sorted(found, key=lambda e: (e["time"], e.get("by", "")))


def current(share: str, node: str) -> dict[str, Any] | None:
    """NODE's cordon (its newest event, when that is a cordon), or None."""
    mine = [e for e in events(share, node) if e["node"] == node]
    return mine[-1] if mine and mine[-1].get("action") == CORDON else None


def cordoned(share: str) -> dict[str, dict[str, Any]]:
    """Every node cordoned now: {node: its cordon}."""
    newest: dict[str, dict[str, Any]] = {}
    for event in events(share):
        newest[event["node"]] = event
    return {n: e for n, e in newest.items() if e.get("action") == CORDON}


def record(share: str, node: str, action: str, why: str, run: str | None = None,
           now: float | None = None) -> dict[str, Any]:
    """Add an event for NODE (CORDON or UNCORDON) by this user; the event. NoRecord when
    the share has no cordon directory."""
    if action not in (CORDON, UNCORDON):
        raise ValueError(f"action {action!r}")
    where = cordons_dir(share)
    if not os.path.isdir(where):
        raise NoRecord(f"{where} does not exist: the share was made without it; run site.yml "
                       "(the nfs_server role makes it)")
    stamp = time.time() if now is None else now
    user = getpass.getuser()
    event = {"node": node, "action": action, "why": why, "by": user, "run": run,
             "time": stamp, "since": datetime.fromtimestamp(stamp, tz=timezone.utc)
             .isoformat(timespec="seconds")}
    name = f"{node}@{int(stamp * 1e9)}@{user}.json"
    tmp = os.path.join(where, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(event, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, os.path.join(where, name))
    return event


def main(request: dict[str, Any]) -> dict[str, Any]:
    """The node verb `cordon` (request on stdin): {"share", "node", "action", "why", "run"}
    adds an event; {"share"} alone lists every node cordoned now."""
    share = request["share"]
    if not request.get("action"):
        return {"cordoned": cordoned(share)}
    try:
        return {"event": record(share, request["node"], request["action"],
                                request.get("why") or "", request.get("run"))}
    except (NoRecord, OSError) as exc:
        return {"error": str(exc)}
