"""What fills the share, by user and by kind (`node.py du`, the node side of `clustertrain
du`).

Every file's blocks count for its owner (the uid that owns the bytes, not the directory
they lie in: a directory made in another user's name holds its writer's files) and for a
kind, from where it lies on the share:

  checkpoints   checkpoints/USER/... (what runs save)
  run records   checkpoints/USER/.clustertrain/... (the nodes' states, hang dumps, plans)
  data          data/...
  wheelhouses   wheelhouse*/... (the environments' packages)
  other         anything else

A user reads what the share's modes let them: another user's private directory is listed
as not read, with its owner, and its bytes count nowhere. An admin runs it as root (`du
--all`, through sudo) and sees everything. Hard links count once. The walk follows no
link, not even one a user swaps in for a directory it has seen (health.walk); the paths it
names are shown with what is not ASCII made visible.
"""

from __future__ import annotations

import os
from typing import Any

from .health import walk
from .protocol import NODE_STATE_DIR
from .space import space
from .untrusted import visible
from .util import owner_of, user_name

KINDS = ("checkpoints", "run records", "data", "wheelhouses", "other")


def kind_of(parts: tuple[str, ...]) -> str:
    """The kind of a path under the share, by its PARTS relative to the share's root."""
    top = parts[0] if parts else ""
    if top == "checkpoints":
        return "run records" if len(parts) > 2 and parts[2] == NODE_STATE_DIR \
            else "checkpoints"
    if top == "data":
        return "data"
    if top.startswith("wheelhouse"):
        return "wheelhouses"
    return "other"


def usage(share: str) -> dict[str, Any]:
    """The share's free space, and its bytes by owner and kind, as JSON: {"share",
    "free", "total", "users": {name: {kind: bytes}}, "unread": [{"path", "owner",
    "why"}]}."""
    users: dict[str, dict[str, int]] = {}
    unread: list[dict[str, str]] = []
    root = os.path.realpath(share)
    for st, parts in walk(root, lambda path, why: unread.append(
            {"path": visible(path, ascii_only=True), "owner": owner_of(path), "why": why})):
        mine = users.setdefault(user_name(st.st_uid), dict.fromkeys(KINDS, 0))
        mine[kind_of(parts)] += st.st_blocks * 512
    [free] = space({"share": root}) or [{}]
    return {"share": root, "free": free.get("free"), "total": free.get("total"),
            "users": {u: k for u, k in sorted(users.items()) if any(k.values())},
            "unread": sorted(unread, key=lambda u: u["path"])}
