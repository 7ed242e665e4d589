"""The cordon record: which nodes every user's runs keep out, on the share where every node
reads it (SHARE/cordons/, made by the nfs_server role: sticky and world-writable, like
/tmp, so that each user adds files and nobody removes another's).

The record is a log of events, one file each, never changed: `NODE@TIME_NS@USER.json`,
{"node", "action": "cordon"|"uncordon", "why", "run"}. Writing a new file is the only
write, so two users never lose each other's event, and nothing needs a lock. Each file is
made readable by every user (0644, whatever the writer's umask: a detached run's recovery
writes under umask 077), so that every user's reader sees the same events.

What an event says is the file's content only where the system cannot say it; the rest is
the system's, never the content's:
- its author is the file's owner (a user name, or "uid N" for an owner the node does not
  know): nobody writes a file in another user's name. The name's USER and the content's
  "by" (kept for people reading the directory) are not believed;
- its time is the file's mtime, which the share's server sets when the file is written.
  An event dated more than SKEW seconds past now, or past its file's ctime, is refused
  (ignored for deciding, and said by `cordon`): a date in the future can only have been
  set by its owner (`touch -d`). The ctime is the server's and nobody can set it, and an
  honest file's mtime is never after it, so a file dated tomorrow is refused tomorrow
  too, not believed once its date has come. Time is not taken from the ctime itself: it
  moves on whenever the inode changes (chmod, rename, a hard link another user makes to
  the file), so an old event would count as new again. A user can date his own event in
  the past (`touch -d`) or touch an old file of his own to now: that only moves his own
  event, which he could as well have written anew; another user's file he can neither
  touch (it is not his, and 0644) nor rename (the sticky bit), and a hard link to it
  keeps its mtime;
- its node is the name's NODE and the content's "node", which must agree (else refused).

Any user may write any number of files there: a reader reads at most the newest PER_NODE
events of each user for each node and PER_OWNER of each user in all (lstat'ed, not
opened, beyond those), so that one user's flood costs every reader a bounded read, and
says the rest in one line per user. Dropping a user's older events of a node changes
nothing the rule decides: his newer events lift or keep his older cordons alike. A writer
(record) removes his own events of the node beyond the newest PER_NODE (the sticky bit
lets him: they are his), and is refused an event of a further node past PER_OWNER //
PER_NODE nodes, so that readers read every event of an honest writer. Every
file is read as untrusted (untrusted.py), and what another user wrote (a reason, a run, a
file name) is shown with its control characters made visible.

Who decides: each reader, from the files, by one rule. Any user may cordon any node (a user
who finds a bad node keeps everyone's runs off it, as a run that loses a node does). A
node is cordoned while any cordon of it holds; an uncordon lifts the cordons before it
that its author may lift: his own, or every one when he is an admin (root, or a member of
the group the inventory's cluster_admin_group names, roles/contract: default sudo). An
uncordon that may lift none of the cordons held is ignored, and said by `cordon`, so a
forged file never lifts another user's cordon. `uncordon` (the verb here) refuses such a
lift up front and writes nothing; a clean `doctor` runs as its user and lifts by the same
rule. The admin group reaches each reader by name: the controller's requests carry the
inventory's value; a caller that gives none reads DEFAULT_ADMIN_GROUP.

Slurm follows the same rule (`helper`, run as root by the slurm role's clustertrain-drain,
which every cluster user may run with sudo): it drains a node only while the record holds
a cordon of it by the calling user (a run cordons, then drains), and returns it to Slurm
only once the record no longer cordons it and the caller wrote a cordon that was lifted,
or is an admin; a drain Slurm holds for another reason (an admin's) is left alone.

This file is the slurm role's (roles/slurm/files/cordon.py, installed root's for the
helper) and the node package's module orchestrator.node.cordon (orchestrator/node/
__init__.py: ROLE_MODULES): the standard library only, and no import of the package.
"""

from __future__ import annotations

import errno
import grp
import importlib
import json
import os
import pwd
import re
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

# Reading what other users wrote: the node package's module, or (run as a script, or as
# root's copy beside the helper and the health check) the untrusted.py beside this file.
untrusted = importlib.import_module(".untrusted", __package__) if __package__ else \
    importlib.import_module("untrusted")

CORDONS_SUBDIR = "cordons"   # under the share's root (nfs_server_subdirectories)
CORDON, UNCORDON = "cordon", "uncordon"
DEFAULT_ADMIN_GROUP = "sudo"  # roles/contract's cluster_admin_group
SKEW = 300.0                 # seconds an event may lie in the future (clocks differ)
MAX_EVENT = 64 * 1024        # bytes: a bigger file is no event
PER_NODE = 3                 # events read of each user for each node: the newest
PER_OWNER = 384              # events read of each user in all: the newest (record()
                             # refuses a user events of more than PER_OWNER // PER_NODE nodes)
NODE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
DRAIN_MARK = "clustertrain ("  # how the helper's drain reasons begin: "clustertrain (USER): "


class NoRecord(Exception):
    """The share has no cordon directory (made by site.yml's nfs_server role)."""


def cordons_dir(share: str) -> str:
    return os.path.join(share, CORDONS_SUBDIR)


def user_name(uid: int) -> str:
    """UID's user name on this node, or "uid N" when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, tz=timezone.utc).isoformat(timespec="seconds")


@dataclass
class Admins:
    """Who may lift anyone's cordon: root, and the members of GROUP (the inventory's
    cluster_admin_group; None or a group this node lacks: root alone)."""

    group: str | None
    known: dict[int, bool] = field(default_factory=dict)

    def __call__(self, uid: int) -> bool:
        if uid == 0:
            return True
        if uid not in self.known:
            self.known[uid] = self._member(uid)
        return self.known[uid]

    def _member(self, uid: int) -> bool:
        if not self.group:
            return False
        try:
            gid = grp.getgrnam(self.group).gr_gid
            user = pwd.getpwuid(uid)
        except KeyError:
            return False
        return gid in os.getgrouplist(user.pw_name, user.pw_gid)

    def describe(self) -> str:
        return f"an admin (a member of group '{self.group}')" if self.group else \
            "an admin (root)"


@dataclass(frozen=True)
class Event:
    """One believed event: its author and time are the file's (see above)."""

    node: str
    action: str
    why: str
    run: str | None
    uid: int
    time: float
    file: str

    @property
    def by(self) -> str:
        return user_name(self.uid)

    def to_json(self) -> dict[str, Any]:
        """The event as shown to every user: what its author wrote made visible."""
        return {"node": self.node, "action": self.action, "why": visible(self.why),
                "run": None if self.run is None else visible(self.run), "by": self.by,
                "uid": self.uid, "time": self.time, "since": iso(self.time),
                "file": visible(self.file)}


@dataclass(frozen=True)
class Ignored:
    """A file of the record that decides nothing, and why (said by `cordon`)."""

    file: str
    by: str
    why: str

    def to_json(self) -> dict[str, str]:
        return {"file": visible(self.file), "by": self.by, "why": visible(self.why)}


@dataclass
class NodeState:
    """One node's events, decided: the cordons that hold, those the last lift lifted, and
    the uncordons ignored because their author may lift none of the cordons held."""

    held: list[Event] = field(default_factory=list)
    lifted: list[Event] = field(default_factory=list)
    refused: list[Event] = field(default_factory=list)

    def authors(self) -> str:
        return " and ".join(dict.fromkeys(c.by for c in self.held))


def visible(text: str) -> str:
    """TEXT another user wrote, its control characters made visible (untrusted.visible)."""
    shown: str = untrusted.visible(text)
    return shown


def node_of(name: str) -> str:
    """The node a record's file NAME (NODE@TIME_NS@USER.json) is of."""
    return name.rsplit("@", 2)[0]


def read(share: str, node: str | None = None, now: float | None = None
         ) -> tuple[list[Event], list[Ignored]]:
    """The events (of NODE) the record holds, oldest first, and the files refused: of each
    user the newest PER_NODE of each node and PER_OWNER in all (one Ignored per user
    says the rest). A writer's temporary file (a leading dot) is neither."""
    try:
        fd = os.open(cordons_dir(share), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return [], []
    try:
        found = untrusted.entries(fd, lambda name: name.endswith(".json") and
                                  not name.startswith(".") and
                                  (node is None or node_of(name) == node))
        per_node = untrusted.bounded(found, PER_NODE, lambda e: (e.info.st_uid, node_of(e.name)))
        kept = untrusted.bounded(per_node.kept, PER_OWNER)
        stamp = time.time() if now is None else now
        events: list[Event] = []
        ignored = [Ignored(f"{n} files", user_name(int(uid)), f"more events of this user: "
                           f"only the newest {PER_OWNER} of each user are read")
                   for uid, n in kept.beyond.items()]
        for entry in kept.kept:
            one = _read_one(fd, entry, stamp)
            if isinstance(one, Event):
                events.append(one)
            elif one is not None:
                ignored.append(one)
    finally:
        os.close(fd)
    return sorted(events, key=lambda e: (e.time, e.file)), ignored


def _read_one(fd: int, entry: Any, now: float) -> Event | Ignored | None:
    """The file ENTRY (untrusted.Entry) of the directory FD as an event, or why it is none
    (None: gone meanwhile, removed by its writer). Opened without following a link nor
    waiting on a pipe, of its lstat's owner: a user's planted file must not hang or fool a
    reader."""
    name, info = entry.name, entry.info
    owner = user_name(info.st_uid)
    if stat.S_ISLNK(info.st_mode):
        return Ignored(name, owner, "cannot be read (a symbolic link: not followed)")
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_EVENT:
        return Ignored(name, owner, "not an event file")
    try:
        found = untrusted.read(name, MAX_EVENT, info.st_uid, fd)
        content = json.loads(found.data.decode("utf-8"))
    except untrusted.NotRead as exc:
        return None if exc.errno == errno.ENOENT else Ignored(name, owner, exc.why)
    except ValueError:
        return Ignored(name, owner, "not an event (cut short, or not JSON)")
    return _event(name, content, found.info, now)


def _event(name: str, content: Any, info: os.stat_result, now: float) -> Event | Ignored:
    owner = user_name(info.st_uid)
    if not isinstance(content, dict) or content.get("action") not in (CORDON, UNCORDON):
        return Ignored(name, owner, "not an event")
    parts = name[:-len(".json")].rsplit("@", 2)
    if len(parts) != 3:
        return Ignored(name, owner, "not named NODE@TIME_NS@USER.json")
    if not NODE_NAME.match(parts[0]):
        return Ignored(name, owner, "its file name names no node")
    if content.get("node") != parts[0]:
        return Ignored(name, owner, f"its content names node {content.get('node')!r}, its "
                       f"file name {parts[0]!r}")
    mtime = info.st_mtime_ns / 1e9
    if mtime > now + SKEW or mtime > info.st_ctime_ns / 1e9 + SKEW:
        return Ignored(name, owner, f"dated {iso(mtime)}, in the future")
    why, run = content.get("why"), content.get("run")
    return Event(parts[0], content["action"], why if isinstance(why, str) else "",
                 run if isinstance(run, str) else None, info.st_uid, mtime, name)


def may_lift(uid: int, cordon: Event, admins: Callable[[int], bool]) -> bool:
    """Whether UID's uncordon lifts CORDON: its author's does, and an admin's."""
    return uid == cordon.uid or admins(uid)


def decide(events: list[Event], admins: Callable[[int], bool]) -> dict[str, NodeState]:
    """Every node's state after EVENTS (oldest first), by the rule above."""
    nodes: dict[str, NodeState] = {}
    for event in events:
        state = nodes.setdefault(event.node, NodeState())
        if event.action == CORDON:
            state.held.append(event)
            continue
        lifted = [c for c in state.held if may_lift(event.uid, c, admins)]
        if lifted:
            state.held = [c for c in state.held if c not in lifted]
            state.lifted = lifted
        elif state.held:
            state.refused.append(event)
    return nodes


def cordon_of(state: NodeState) -> dict[str, Any]:
    """What a node's cordon says: its newest cordon held, and every author holding one."""
    return {**state.held[-1].to_json(), "held_by": list(dict.fromkeys(c.by for c in state.held))}


def current(share: str, node: str, admin_group: str | None = DEFAULT_ADMIN_GROUP
            ) -> dict[str, Any] | None:
    """NODE's cordon (its newest cordon held, "held_by" naming every author of one), or
    None when it is not cordoned."""
    state = decide(read(share, node)[0], Admins(admin_group)).get(node)
    return cordon_of(state) if state and state.held else None


def cordoned(share: str, admin_group: str | None = DEFAULT_ADMIN_GROUP
             ) -> dict[str, dict[str, Any]]:
    """Every node cordoned now: {node: its cordon}."""
    states = decide(read(share)[0], Admins(admin_group))
    return {n: cordon_of(s) for n, s in sorted(states.items()) if s.held}


def listing(share: str, admin_group: str | None = DEFAULT_ADMIN_GROUP) -> dict[str, Any]:
    """The verb's list: {"cordoned": {node: its cordon}, "ignored": [files that decide
    nothing, with why, the uncordons ignored among them]}."""
    events, ignored = read(share)
    admins = Admins(admin_group)
    states = decide(events, admins)
    for node, state in sorted(states.items()):
        for lift in state.refused:
            ignored.append(Ignored(lift.file, lift.by, f"an uncordon of {node} by someone "
                                   f"who may not lift its cordon ({lift.by}: not its author "
                                   f"nor {admins.describe()})"))
    return {"cordoned": {n: cordon_of(s) for n, s in sorted(states.items()) if s.held},
            "ignored": [i.to_json() for i in ignored]}


def record(share: str, node: str, action: str, why: str, run: str | None = None,
           now: float | None = None) -> dict[str, Any]:
    """Add an event for NODE (CORDON or UNCORDON) by this user; the event. NOW dates it
    (tests; without it the share's server does). NoRecord when the share has no cordon
    directory."""
    if action not in (CORDON, UNCORDON):
        raise ValueError(f"action {action!r}")
    where = cordons_dir(share)
    if not os.path.isdir(where):
        raise NoRecord(f"{where} does not exist: the share was made without it; run site.yml "
                       "(the nfs_server role makes it)")
    uid = os.geteuid()
    stamp = time.time() if now is None else now
    content = {"node": node, "action": action, "why": why, "by": user_name(uid), "run": run,
               "since": iso(stamp)}
    tmp = os.path.join(where, f".{node}@{int(stamp * 1e9)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        _make_room(where, os.fstat(fd).st_uid, node)   # the share's owner (root squashed)
        os.fchmod(fd, 0o644)   # every user reads it, whatever this process' umask
        with os.fdopen(os.dup(fd), "w", encoding="utf-8") as fh:
            json.dump(content, fh)
            fh.flush()
            os.fsync(fh.fileno())
        if now is not None:
            os.utime(fd, (now, now))
        info = os.fstat(fd)
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    name = f"{node}@{int(stamp * 1e9)}@{user_name(info.st_uid).replace(' ', '')}.json"
    os.rename(tmp, os.path.join(where, name))
    return Event(node, action, why, run, info.st_uid, info.st_mtime_ns / 1e9, name).to_json()


class TooMany(OSError):
    """This user holds events of as many nodes as the record reads of one user."""


def _make_room(where: str, uid: int, node: str) -> None:
    """Before UID writes an event of NODE in WHERE: remove UID's own events of NODE but the
    newest PER_NODE - 1 (none a reader reads once the new one is there); TooMany when NODE
    would be one node too many (PER_OWNER // PER_NODE): so that a reader, who reads
    PER_OWNER events of each user, reads all of an honest writer's."""
    mine = [e for e in untrusted.entries(where, lambda n: n.endswith(".json") and
                                         not n.startswith("."))
            if e.info.st_uid == uid and stat.S_ISREG(e.info.st_mode)]
    nodes = {node_of(e.name) for e in mine}
    most = PER_OWNER // PER_NODE
    if node not in nodes and len(nodes) >= most:
        raise TooMany(f"{user_name(uid)} holds events of {len(nodes)} nodes in {where}, the "
                      f"most one user may ({most}): remove your events of nodes you no "
                      "longer cordon (your files NODE@*.json there whose newest is an "
                      "uncordon), or ask an admin to")
    of_node = sorted((e for e in mine if node_of(e.name) == node),
                     key=lambda e: (e.info.st_mtime_ns, e.name), reverse=True)
    for old in of_node[PER_NODE - 1:]:
        try:
            os.unlink(os.path.join(where, old.name))
        except FileNotFoundError:
            pass


def lift(share: str, node: str, why: str, admin_group: str | None) -> dict[str, Any]:
    """This user's uncordon of NODE: {"refused": why} (nothing written) when NODE's
    cordons are all ones this user may not lift; else {"event": the uncordon (None when
    nothing was held), "lifted": [cordons], "held": [cordons that still hold: others']}."""
    admins = Admins(admin_group)
    me = os.geteuid()
    held = decide(read(share, node)[0], admins).get(node, NodeState()).held
    mine = [c for c in held if may_lift(me, c, admins)]
    if held and not mine:
        state = NodeState(held)
        newest = held[-1]
        return {"refused": f"{node} is cordoned by {state.authors()} since {iso(newest.time)} "
                f"({visible(newest.why) or 'no reason given'}); {user_name(me)} may not lift "
                f"it: only {admins.describe()} or {state.authors()}, who cordoned it, may"}
    event = record(share, node, UNCORDON, why) if held else None
    return {"event": event, "lifted": [c.to_json() for c in mine],
            "held": [c.to_json() for c in held if c not in mine]}


def main(request: dict[str, Any]) -> dict[str, Any]:
    """The node verb `cordon` (request on stdin): {"share", "node", "action", "why", "run",
    "admin_group"} adds an event (an uncordon as `lift` says); {"share", "admin_group"}
    lists every node cordoned now and the files ignored."""
    share = request["share"]
    group = request.get("admin_group") or DEFAULT_ADMIN_GROUP
    if not request.get("action"):
        return listing(share, group)
    try:
        if request["action"] == UNCORDON:
            if not os.path.isdir(cordons_dir(share)):
                raise NoRecord(f"{cordons_dir(share)} does not exist: the share was made "
                               "without it; run site.yml (the nfs_server role makes it)")
            return lift(share, request["node"], request.get("why") or "", group)
        return {"event": record(share, request["node"], request["action"],
                                request.get("why") or "", request.get("run"))}
    except (NoRecord, OSError) as exc:
        return {"error": str(exc)}


# -- Slurm's drain and resume: clustertrain-drain (roles/slurm), run as root by a user ----

@dataclass(frozen=True)
class Slurm:
    """What the slurm role tells its helper: the share, the admin group, scontrol."""

    share: str
    admin_group: str | None
    scontrol: str


class Refused(Exception):
    """The helper does nothing, for this reason."""


def caller_uid(environ: Mapping[str, str]) -> int:
    """Who runs the helper: the sudo caller (sudo sets SUDO_UID), else this process' user."""
    uid = os.getuid()
    return int(environ["SUDO_UID"]) if uid == 0 and environ.get("SUDO_UID", "").isdigit() \
        else uid


def helper(argv: list[str], slurm: Slurm, caller: int) -> int:
    """`clustertrain-drain NODE REASON` drains NODE, `clustertrain-drain --resume NODE`
    returns it to Slurm, each when the record allows CALLER to (see above); the exit
    status (2: a bad command line, 1: refused)."""
    resume = argv[:1] == ["--resume"]
    args = argv[1:] if resume else argv
    if len(args) != (1 if resume else 2):
        print("usage: clustertrain-drain NODE REASON | clustertrain-drain --resume NODE",
              file=sys.stderr)
        return 2
    if not NODE_NAME.match(args[0]):
        print(f"clustertrain-drain: not a node name: {args[0]!r}", file=sys.stderr)
        return 2
    try:
        said = _resume(slurm, args[0], caller) if resume else \
            _drain(slurm, args[0], args[1], caller)
    except Refused as exc:
        print(f"clustertrain-drain: {exc}", file=sys.stderr)
        return 1
    print(said)
    return 0


def _drain(slurm: Slurm, node: str, reason: str, caller: int) -> str:
    state = decide(read(slurm.share, node)[0], Admins(slurm.admin_group)).get(node)
    who = user_name(caller)
    if not any(c.uid == caller for c in (state.held if state else [])):
        raise Refused(f"the share's record ({cordons_dir(slurm.share)}) holds no cordon of "
                      f"{node} by {who}: a node is drained once it is cordoned "
                      f"(python -m orchestrator cordon {node} --why TEXT)")
    now = drained(slurm, node)
    if now is not None and not now.startswith(DRAIN_MARK):
        return f"{node} is drained already ({now}): left as it is"
    scontrol(slurm, "update", f"NodeName={node}", "State=DRAIN", drain_reason(who, reason))
    return f"{node} drained"


def _resume(slurm: Slurm, node: str, caller: int) -> str:
    admins = Admins(slurm.admin_group)
    state = decide(read(slurm.share, node)[0], admins).get(node, NodeState())
    if state.held:
        raise Refused(f"{node} is still cordoned by {state.authors()} in the share's record: "
                      f"`uncordon {node}` first")
    authors = dict.fromkeys(c.by for c in state.lifted)
    if not (admins(caller) or any(c.uid == caller for c in state.lifted)):
        raise Refused(f"{user_name(caller)} may not return {node} to Slurm: only "
                      f"{admins.describe()} or the author of its last lifted cordon "
                      f"({' and '.join(authors) or 'none'}) may")
    now = drained(slurm, node)
    if now is None:
        return f"{node} is not drained"
    if not now.startswith(DRAIN_MARK):
        raise Refused(f"{node} is drained for another reason ({now}): an admin returns it "
                      f"(scontrol update NodeName={node} State=RESUME)")
    scontrol(slurm, "update", f"NodeName={node}", "State=RESUME")
    return f"{node} returned to Slurm"


def drain_reason(who: str, why: str) -> str:
    """scontrol's Reason= for a drain by WHO (a user, or the health check): DRAIN_MARK, WHO,
    then WHY, printable and at most 200 characters."""
    text = "".join(ch for ch in why if ch.isprintable())[:200]
    return f"Reason={DRAIN_MARK}{who}): {text}"


def drained(slurm: Slurm, node: str) -> str | None:
    """NODE's drain reason in Slurm ("" when it gives none), or None when not drained."""
    shown = scontrol(slurm, "show", "node", node)
    state = re.search(r"\bState=(\S+)", shown)
    if not state or "DRAIN" not in state.group(1):
        return None
    reason = re.search(r"^\s*Reason=(.*?)(?: \[[^\]]*\])?\s*$", shown, re.MULTILINE)
    return reason.group(1) if reason else ""


def scontrol(slurm: Slurm, *args: str) -> str:
    done = subprocess.run([slurm.scontrol, *args], capture_output=True, text=True,
                          timeout=30, check=False)
    if done.returncode != 0:
        raise Refused(f"scontrol {' '.join(args[:2])}: "
                      f"{done.stderr.strip()[-300:] or f'exit {done.returncode}'}")
    return done.stdout
