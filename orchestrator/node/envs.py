"""A user's own environments on this node (standard library only): ~/.clustertrain/envs,
where `env create` (playbooks/user_env.yml) makes NAME-KEY/ for each state of an
environment file and points NAME at the newest. Listed with their size, last use and the
processes that use them; removed only when none does. A NAME-KEY/ without env.json is an
`env create` that did not finish (interrupted, or failed on this node): listed as
incomplete, so that `env rm` can remove it and the user sees why it is not usable."""

from __future__ import annotations

import os
import re
import shutil
import time
from typing import Any

from .protocol import ENV_NAME_PATTERN, ENVS_DIR, LAST_USED
from .util import read_json

# NAME-KEY, as playbooks/user_env.yml names a state: KEY is 12 hex digits of its digest.
STATE_DIR = re.compile(ENV_NAME_PATTERN + r"-(?P<key>[0-9a-f]{12})")


def root() -> str:
    return os.path.join(os.path.expanduser("~"), ENVS_DIR)


def _size(path: str) -> int:
    total = 0
    for top, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                pass
    return total


def users_of(prefix: str) -> list[int]:
    """This user's processes that run from PREFIX: its python or a script of it on their
    command line (a venv's python is a link to the system's: /proc/PID/exe cannot tell),
    or a library of it mapped (torch's, say)."""
    prefix = prefix.rstrip("/") + "/"
    me, found = os.getuid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != me or int(pid) == os.getpid():
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = [a.decode(errors="replace") for a in fh.read().split(b"\0")[:2]]
            if any(a.startswith(prefix) for a in argv):
                found.append(int(pid))
                continue
            with open(f"/proc/{pid}/maps") as fh:
                if any(prefix in line for line in fh):
                    found.append(int(pid))
        except OSError:
            continue   # gone meanwhile, or not ours to read
    return sorted(found)


def describe(path: str, current: bool) -> dict[str, Any]:
    env = read_json(os.path.join(path, "env.json"))
    complete = env is not None
    if env is None:   # not finished (or its env.json unreadable): name and key from the directory's
        base = os.path.basename(path)
        match = STATE_DIR.fullmatch(base)
        env = ({"name": base[:match.start("key") - 1], "key": match.group("key")} if match
               else {"name": base, "key": ""})
    made = read_json(os.path.join(path, "python_env.json")) or {}
    fp = read_json(os.path.join(path, "fingerprint.json")) or {}
    used = os.path.join(path, LAST_USED)
    stamp = os.path.getmtime(used) if os.path.exists(used) else None
    prefix = made.get("prefix") or path
    return {"name": env.get("name"), "key": env.get("key"), "dir": path, "current": current,
            "complete": complete,
            "backend": made.get("backend"), "fingerprint": (fp.get("sha256") or "")[:12],
            "packages": len(fp.get("packages") or {}), "size": _size(path),
            "last_used": stamp, "in_use": users_of(prefix)}


def list_envs(name: str | None = None) -> dict[str, Any]:
    """Every environment here (of NAME only, when given), newest name first."""
    top = root()
    try:
        entries = sorted(os.listdir(top))
    except FileNotFoundError:
        entries = []
    currents = {os.path.realpath(os.path.join(top, e)) for e in entries
                if os.path.islink(os.path.join(top, e))}
    envs = []
    for entry in entries:
        path = os.path.join(top, entry)
        if os.path.islink(path) or not os.path.isdir(path) or not (
                os.path.isfile(os.path.join(path, "env.json")) or STATE_DIR.fullmatch(entry)):
            continue
        env = describe(path, os.path.realpath(path) in currents)
        if name is None or env["name"] == name:
            envs.append(env)
    return {"root": top, "envs": envs, "now": time.time()}


def remove(name: str, key: str | None = None) -> dict[str, Any]:
    """Remove NAME's environments (only KEY's, when given), unless a process uses one:
    then nothing is removed and `in_use` names them."""
    envs = [e for e in list_envs(name)["envs"] if key is None or e["key"] == key]
    busy = {e["dir"]: e["in_use"] for e in envs if e["in_use"]}
    if busy:
        return {"removed": [], "in_use": busy}
    for env in envs:
        shutil.rmtree(env["dir"])
    link = os.path.join(root(), name)
    if os.path.islink(link) and not os.path.exists(link):
        os.unlink(link)   # it named one of those removed
    return {"removed": [e["dir"] for e in envs], "in_use": {}}


def prune(name: str, keep: int) -> dict[str, Any]:
    """Remove the states of NAME beyond the KEEP newest (by when they were made), as old
    run snapshots are pruned: never the one NAME points at, never one in use, never one
    not finished (another `env create` may be making it now: `env rm` removes it)."""
    envs = [e for e in list_envs(name)["envs"] if e["complete"]]
    made = sorted(envs, key=lambda e: os.path.getmtime(os.path.join(e["dir"], "env.json")),
                  reverse=True)
    old = [e for e in made[keep:] if not e["current"] and not e["in_use"]]
    for env in old:
        shutil.rmtree(env["dir"])
    return {"removed": [e["dir"] for e in old], "in_use": {}}
