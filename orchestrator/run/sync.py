"""Copy the training code to every node, into a per-run snapshot.

Each run gets ~/.clustertrain/code/<run-id>/ of the job user on every node (the copy
never becomes root, whatever the inventory's ansible_become says: the code belongs to the
user who trains); rsync --link-dest against the previous snapshot (code/latest)
hard-links unchanged files, so a re-sync with no changes copies nothing, and editing
code locally never changes a job that is already running. Excludes follow the
.gitignore files of the code directory (rsync dir-merge filter).

Three ways a node's snapshot is made, cheapest first, each over the SSH connection
preflight opened:
- reused: every snapshot is sealed with the digest of the local tree it was made from (the
  files rsync sends, by name, size, mode and mtime) and the state of the snapshot on the
  node (so files a job wrote into its working directory, or edits made on the node, are
  noticed). When both still hold, the new snapshot is a hard-linked copy of the previous
  one: one round trip.
- delta: the node has a previous snapshot, of other code (an edited file, another work
  directory): rsync sends what differs over the open connection, hard-linking the rest
  against it (the edit-and-run loop: a fraction of a second).
- first: a node where this user has no snapshot yet gets the sync play through
  ansible-runner, which lays out the user's private state directory and copies the whole
  tree (as it does for a caller without open connections).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..cluster import nodelib
from ..cluster.fanout import each
from ..cluster.inventory import Cluster
from ..cluster.playbook import run_playbook
from ..cluster.ssh import DROPPED, Connection, Result, alone
from ..errors import LaunchError
from ..node import requests as rq
from ..node.answers import CarryAnswer
from ..node.protocol import CODE_SUBDIR, NODE_STATE_DIR

# What the snapshot leaves out, for rsync (the sync) and for code_digest alike.
RSYNC_FILTERS = ("--filter=:-_.gitignore", "--exclude=.git/", "--exclude=__pycache__/")
# A file is the previous snapshot's (linked, not sent) when its size and mtime are, to the
# nanosecond: rsync's default compares whole seconds, and missed an edit that kept the size
# within the second of the previous sync.
EXACT_TIMES = "--modify-window=-1"
SEAL = f"{NODE_STATE_DIR}/synced"   # in a snapshot: "<code digest> <snapshot state>"
NOT_REUSED = 3   # reuse_command's exit code: the latest snapshot is not this code's
FIRST = 4        # reuse_command's exit code: the user has no snapshot on the node yet
RSH_VAR = "clustertrain_rsh"   # the sync play's {node: rsync's --rsh}
# The state of the snapshot in $1 as it is on the node: every file's path, size, mtime and
# mode, every directory's path and mode. Left out: its .clustertrain/ (the seal), and
# __pycache__/ (written by every import, as the sync leaves it too); a directory's mtime
# changes with those.
_STATE = ("state() { find \"$1\" \\( -path \"$1/.clustertrain\" -o -name __pycache__ \\) "
          "-prune -o -type d -printf '%P/ %m\\n' -o -printf '%P %s %T@ %m\\n' "
          "| LC_ALL=C sort | sha256sum | cut -c1-64; }")


# A copy whose connection was dropped before the login (an sshd, or a bastion's, beyond
# MaxStartups - default 10:30:100 - when many nodes connect at once) is tried again;
# other failures are reported at once. rsync runs its own ssh: Ansible's connection
# retries would not cover it.
RETRY_DROPPED = {"register": "copied", "retries": 3, "delay": 1,
                 "until": "copied is succeeded or (copied.msg | default('')) is not "
                          f"search('{DROPPED.pattern}')"}


def filters(exclude: tuple[str, ...] = ()) -> tuple[str, ...]:
    """RSYNC_FILTERS and the directories of the code tree left out (EXCLUDE: paths
    relative to it, such as a runs directory inside it)."""
    return (*RSYNC_FILTERS, *(f"--exclude=/{path.strip('/')}/" for path in exclude))


def left_out(workdir: Path, *dirs: Path) -> tuple[str, ...]:
    """Those of DIRS that lie inside WORKDIR (the runs directory, when train runs from
    inside the code it syncs), relative to it: the sync leaves them out."""
    found = []
    for d in dirs:
        try:
            found.append(str(d.resolve().relative_to(workdir.resolve())))
        except ValueError:
            continue
    return tuple(f for f in found if f != ".")


def sync_playbook(workdir: Path, run_id: str, exclude: tuple[str, ...] = ()) -> list[dict]:
    """EXCLUDE: directories of WORKDIR left out (see filters). The play's extra variable
    RSH_VAR gives each node's remote shell (rsh)."""
    code_root = f"{NODE_STATE_DIR}/{CODE_SUBDIR}"   # relative to the user's home
    dest = f"{code_root}/{run_id}/"
    return [{
        "name": "Sync the training code into a per-run snapshot",
        "hosts": "train_nodes",
        "gather_facts": False,
        # Play vars outrank the inventory's ansible_become: the job user owns its code.
        # The nodes answered preflight a moment ago: a connection that fails now (ssh
        # exits 255) was dropped on the way, e.g. by a bastion beyond MaxStartups when
        # many nodes connect at once, and is tried again.
        "vars": {"ansible_become": False, "ansible_ssh_retries": 3},
        "tasks": [
            {"name": "Create the user's private state directory",
             "ansible.builtin.file": {"path": f"~/{NODE_STATE_DIR}", "state": "directory",
                                      "mode": "0700"}},
            {"name": "Create the snapshot root",
             "ansible.builtin.file": {"path": f"~/{code_root}", "state": "directory",
                                      "mode": "0700"}},
            {"name": "Find the previous snapshot",
             "ansible.builtin.stat": {"path": f"~/{code_root}/latest"},
             "register": "previous"},
            {"name": "Copy the code (hard links to the previous snapshot where unchanged)",
             "ansible.posix.synchronize": {
                 "src": f"{workdir}/",
                 "dest": dest,
                 "archive": True,
                 "delete": True,
                 "link_dest": "{{ [previous.stat.lnk_source] if previous.stat.islnk | "
                              "default(false) else omit }}",
                 # rsync's SSH is the orchestrator's (RSH_VAR): synchronize's own reads
                 # only the ssh plugin's settings, and misses a paramiko host's proxy.
                 "rsync_opts": [*filters(exclude), EXACT_TIMES,
                                f"--rsh={{{{ {RSH_VAR}[inventory_hostname] }}}}"],
             },
             **RETRY_DROPPED},
            {"name": "Point 'latest' at this snapshot",
             "ansible.builtin.file": {"src": run_id, "dest": f"~/{code_root}/latest",
                                      "state": "link", "force": True}},
        ],
    }]


def code_digest(workdir: Path, exclude: tuple[str, ...] = ()) -> str:
    """The local tree as the sync would send it: the entries rsync lists under
    RSYNC_FILTERS (files with their size, mode and mtime to the nanosecond, directories
    with their mode). Any edit, new or removed file changes it."""
    listing = subprocess.run(["rsync", "-a", "--list-only", *filters(exclude), f"{workdir}/"],
                             capture_output=True, text=True, check=True).stdout
    digest = hashlib.sha256()
    entries = []
    for line in listing.splitlines():
        mode, size, _date, _time, name = line.split(maxsplit=4)
        if mode.startswith("d"):  # a directory's mtime and size change with what is left out
            entries.append(f"{name}\0{mode}")
        else:
            mtime = os.lstat(workdir / name.split(" -> ")[0]).st_mtime_ns
            entries.append(f"{name}\0{mode} {size} {mtime}")
    for entry in sorted(entries):  # by name
        digest.update(f"{entry}\0".encode())
    return digest.hexdigest()


def _node_state_root() -> str:
    return f"\"$HOME\"/{NODE_STATE_DIR}/{CODE_SUBDIR}"


def reuse_command(run_id: str, digest: str) -> str:
    """Shell for a node: make RUN_ID's snapshot a hard-linked copy of the latest one if
    that one was sealed with DIGEST and is still as it was sealed; exit NOT_REUSED if not,
    FIRST if there is no latest snapshot."""
    root, run = _node_state_root(), shlex.quote(run_id)
    return _sh(f"{_STATE}; root={root}; prev=$(readlink \"$root/latest\") && "
               f"[ -d \"$root/$prev\" ] || exit {FIRST}; "
               f"read -r have sealed < \"$root/$prev/{SEAL}\" || exit {NOT_REUSED}; "
               f"[ \"$have\" = {digest} ] && [ \"$(state \"$root/$prev\")\" = \"$sealed\" ] "
               f"|| exit {NOT_REUSED}; rm -rf \"$root/.{run}.part\" && "
               f"cp -al \"$root/$prev\" \"$root/.{run}.part\" && "
               f"mv \"$root/.{run}.part\" \"$root/\"{run} && "
               f"ln -sfn {run} \"$root/latest\" && {_seal_script(run_id, digest)}")


def seal_command(run_id: str, digest: str) -> str:
    """Shell for a node: RUN_ID's snapshot (just copied) made the latest and sealed with
    DIGEST."""
    root, run = _node_state_root(), shlex.quote(run_id)
    return _sh(f"{_STATE}; ln -sfn {run} {root}/latest && {_seal_script(run_id, digest)}")


def _sh(script: str) -> str:
    return f"sh -c {shlex.quote(script)}"  # whatever the user's login shell is


def _seal_script(run_id: str, digest: str) -> str:
    """RUN_ID's snapshot sealed with DIGEST and its present state (in a new file: the
    previous snapshot's seal, hard-linked into this one, is left as it is)."""
    snap = f"{_node_state_root()}/{shlex.quote(run_id)}"
    return (f"s=$(state {snap}) && mkdir -p {snap}/{NODE_STATE_DIR} && rm -f {snap}/{SEAL} && "
            f"echo \"{digest} $s\" > {snap}/{SEAL}")


@dataclass(frozen=True)
class SyncResult:
    run_id: str
    seconds: float
    reused: list[str] = field(default_factory=list)  # nodes whose code was unchanged
    delta: list[str] = field(default_factory=list)   # nodes sent only what changed
    # node -> what the last run from this work directory wrote there, carried (carry.py)
    carried: dict[str, CarryAnswer] = field(default_factory=dict)

    def carried_lines(self) -> list[str]:
        """What train says of the files carried from the last run (and of those the code
        has too, which keep the code's version)."""
        lines = []
        files = {n: c for n, c in self.carried.items() if c.carried}
        if files:
            names = sorted({f for c in files.values() for f in c.carried})
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5
                                            else "")
            sources = sorted({str(c.from_) for c in files.values()})
            lines.append(f"{', '.join(sorted(files))}: the files the last run from this work "
                         f"directory wrote there ({', '.join(sources)}) are in this run's "
                         f"working directory too: {shown}")
        clash = {n: c.kept_code for n, c in self.carried.items() if c.kept_code}
        for node, names in sorted(clash.items()):
            lines.append(f"{node}: the code has {', '.join(names[:5])} too and keeps its own; "
                         f"the last run's are in ~/{NODE_STATE_DIR}/{CODE_SUBDIR}/"
                         f"{self.carried[node].from_}/")
        return lines


def sync_code(cluster: Cluster, workdir: Path, run_id: str, quiet: bool = True,
              clients: dict[str, Connection] | None = None,
              exclude: tuple[str, ...] = ()) -> SyncResult:
    """Make RUN_ID's snapshot of WORKDIR on every node. With CLIENTS (open connections
    to every node), each node's snapshot is reused, a delta or a first copy (the module's
    doc), sealed, and the last run's files are carried into it; without, every node gets
    the sync play."""
    workdir = workdir.resolve()
    if not workdir.is_dir():
        raise LaunchError(f"code directory {workdir} does not exist; pass --workdir DIR")
    start = time.monotonic()
    if not clients:
        _play(cluster, workdir, run_id, cluster.names, quiet, None, exclude)
        return SyncResult(run_id, time.monotonic() - start)
    digest = code_digest(workdir, exclude)
    tried = reuse_and_carry(cluster, workdir, run_id, digest, clients)
    first = [n for n in cluster.names if tried[n] == FIRST]
    delta = [n for n in cluster.names if tried[n] == NOT_REUSED]
    if first:
        _play(cluster, workdir, run_id, first, quiet, clients, exclude)
    if delta:
        _delta(workdir, run_id, {n: clients[n] for n in delta}, exclude)
    carried = {n: c for n, c in tried.items() if isinstance(c, CarryAnswer)}
    reused = list(carried)
    carried.update(seal_and_carry(cluster, workdir, run_id, digest, clients,
                                  [n for n in cluster.names if n in first or n in delta]))
    return SyncResult(run_id, time.monotonic() - start, reused, delta, carried)


def _play(cluster: Cluster, workdir: Path, run_id: str, names: list[str], quiet: bool,
          clients: dict[str, Connection] | None, exclude: tuple[str, ...]) -> None:
    """The sync play (sync_playbook) through ansible-runner, on the named nodes."""
    with tempfile.TemporaryDirectory(prefix="clustertrain-sync-") as tmp:
        playbook = Path(tmp) / "project" / "sync.yml"
        playbook.parent.mkdir()
        playbook.write_text(yaml.safe_dump(sync_playbook(workdir, run_id, exclude),
                                           sort_keys=False))
        result = run_playbook(tmp, playbook, cluster.inventory, limit=",".join(names),
                              quiet=quiet, extravars={RSH_VAR: rsh(cluster, names, clients)})
    if result.rc != 0:
        raise LaunchError("code sync failed (nothing was started):\n  " + "\n  ".join(
            result.failures or result.output_tail.splitlines()
            or [f"ansible-runner status {result.status}"]))


def _delta(workdir: Path, run_id: str, clients: dict[str, Connection],
           exclude: tuple[str, ...]) -> None:
    """RUN_ID's snapshot on each node of CLIENTS by rsync over its open connection, every
    file unchanged since the node's latest snapshot hard-linked to it."""
    dest = f"{NODE_STATE_DIR}/{CODE_SUBDIR}/{run_id}/"   # relative to the user's home

    def one(name: str) -> None:
        conn = clients[name]
        host = f"[{conn.target.host}]" if ":" in conn.target.host else conn.target.host
        # --whole-file: a changed file is sent whole. rsync's delta against a --link-dest
        # basis given relative to the destination (the home's path is the node's) failed
        # its own check ("failed verification") whenever blocks matched: a file touched,
        # or edited in part. Within a cluster network, whole files cost no more.
        copy = subprocess.run(["rsync", "-a", "--whole-file", "--delete", "--link-dest=../latest",
                               EXACT_TIMES, *filters(exclude), f"--rsh={shlex.join(conn.shell())}",
                               f"{workdir}/", f"{host}:{dest}"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if copy.returncode != 0:   # rsync's own lines say why; its last, only its code
            said = [line for line in copy.stderr.splitlines() if line.strip()]
            why = [line for line in said if not line.startswith("rsync error:")] or said
            raise LaunchError(f"{name}: " + ("; ".join(why[:3]) or
                                             f"rsync exited {copy.returncode}"))

    failed = each(list(clients), one, str).failed
    if failed:
        raise LaunchError("code sync failed (nothing was started):\n  " + "\n  ".join(
            str(exc) for exc in failed.values()))


def rsh(cluster: Cluster, names: list[str], clients: dict[str, Connection] | None
        ) -> dict[str, str]:
    """rsync's remote shell to each named node: the SSH the orchestrator's own commands
    use (the inventory's user, key, port, options and proxy, whichever connection plugin
    it names), over the node's open connection where there is one. Quoted twice: rsync
    splits the command, and synchronize runs rsync's command line through shlex first."""
    def argv(name: str) -> list[str]:
        if clients and name in clients:
            return clients[name].shell()
        return alone(cluster.node(name).ssh)
    return {name: shlex.quote(shlex.join(argv(name))) for name in names}


def work_key(workdir: Path) -> str:
    """A work directory's name on the nodes: its runs carry what the last one wrote."""
    return hashlib.sha256(str(workdir.resolve()).encode()).hexdigest()[:16]


CARRY_ROOT = f"~/{NODE_STATE_DIR}/{CODE_SUBDIR}"   # the snapshots, for `node.py carry`


def reuse_and_carry(cluster: Cluster, workdir: Path, run_id: str, digest: str,
                    clients: dict[str, Connection]) -> dict[str, CarryAnswer | int]:
    """Per node: what was carried (a dict) where the latest snapshot is sealed with
    DIGEST and untouched, RUN_ID's snapshot linked from it (reuse_command) and the last
    run's files carried into it (carry), in one round trip; else NOT_REUSED (a previous
    snapshot to send the delta against) or FIRST (none, or the node did not answer: the
    play tries it again, and says what is wrong)."""
    def one(name: str) -> CarryAnswer | int:
        try:
            return _then_carry(cluster, workdir, run_id, clients, name,
                               reuse_command(run_id, digest), (NOT_REUSED, FIRST))
        except (OSError, TimeoutError):
            return FIRST

    return each(cluster.names, one, str).values_or_raise()


def seal_and_carry(cluster: Cluster, workdir: Path, run_id: str, digest: str,
                   clients: dict[str, Connection], names: list[str]
                   ) -> dict[str, CarryAnswer]:
    """On each node of NAMES, whose RUN_ID snapshot was just copied: the snapshot made the
    latest and sealed with DIGEST (unsealed, it is only synced again next time), then the
    last run's files carried into it, in one round trip; what was carried, per node."""
    def one(name: str) -> CarryAnswer:
        said = _then_carry(cluster, workdir, run_id, clients, name,
                           f"{seal_command(run_id, digest)} || true", ())
        assert isinstance(said, CarryAnswer)   # no exit code is passed through
        return said

    return each(names, one, str).values_or_raise()


def _then_carry(cluster: Cluster, workdir: Path, run_id: str,
                clients: dict[str, Connection], name: str, script: str,
                passed: tuple[int, ...]) -> CarryAnswer | int:
    """SCRIPT on node NAME, then `node.py carry` (carry) if it succeeded, in one round
    trip: what was carried, or SCRIPT's exit code if it is one of PASSED."""
    python = cluster.node(name).python
    request = rq.Carry(CARRY_ROOT, run_id, work_key(workdir))
    result = clients[name].run(_sh(f"{script} || exit $?; " + nodelib.command(python, request)),
                               timeout=300)
    if result.exit_code in passed:
        return result.exit_code
    if result.exit_code == nodelib.MISSING:   # SCRIPT done; the node lacks this version
        result = nodelib.call(clients[name], python, request, timeout=300)
    return _carried(name, result, request)


def _carried(name: str, result: Result, request: rq.Carry) -> CarryAnswer:
    """What `node.py carry` (REQUEST) said it carried on node NAME (LaunchError if it
    failed)."""
    try:
        return nodelib.answer_to(result, name, request)
    except nodelib.NodeAnswerError as exc:
        raise LaunchError(f"{name}: could not carry the last run's files into the new "
                          f"snapshot: {exc.said}") from None
