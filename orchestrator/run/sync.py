"""Copy the training code to every node, into a per-run snapshot, with ansible-runner.

Each run gets ~/.clustertrain/code/<run-id>/ of the job user on every node (the play
never becomes root, whatever the inventory's ansible_become says: the code belongs to the
user who trains); rsync --link-dest against the previous snapshot (code/latest)
hard-links unchanged files, so a re-sync with no changes copies nothing, and editing
code locally never changes a job that is already running. Excludes follow the
.gitignore files of the code directory (rsync dir-merge filter).

Code unchanged since the last sync skips ansible-runner: every snapshot is sealed with the
digest of the local tree it was made from (the files rsync sends, by name, size, mode and
mtime) and the state of the snapshot on the node (so files a job
wrote into its working directory, or edits made on the node, are noticed). When both
still hold, the node's new snapshot is a hard-linked copy of the previous one, made over
the SSH connection preflight opened: one round trip instead of a playbook.
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
from ..node.protocol import CODE_SUBDIR, NODE_STATE_DIR

# What the snapshot leaves out, for rsync (the sync) and for code_digest alike.
RSYNC_FILTERS = ("--filter=:-_.gitignore", "--exclude=.git/", "--exclude=__pycache__/")
SEAL = f"{NODE_STATE_DIR}/synced"   # in a snapshot: "<code digest> <snapshot state>"
NOT_REUSED = 3   # reuse_command's exit code: the latest snapshot is not this code's
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
                 "rsync_opts": [*filters(exclude),
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
    that one was sealed with DIGEST and is still as it was sealed; exit NOT_REUSED if not."""
    root, run = _node_state_root(), shlex.quote(run_id)
    return _sh(f"{_STATE}; root={root}; prev=$(readlink \"$root/latest\") || exit {NOT_REUSED}; "
            f"read -r have sealed < \"$root/$prev/{SEAL}\" || exit {NOT_REUSED}; "
            f"[ \"$have\" = {digest} ] && [ \"$(state \"$root/$prev\")\" = \"$sealed\" ] "
            f"|| exit {NOT_REUSED}; rm -rf \"$root/.{run}.part\" && "
            f"cp -al \"$root/$prev\" \"$root/.{run}.part\" && "
            f"mv \"$root/.{run}.part\" \"$root/\"{run} && "
            f"ln -sfn {run} \"$root/latest\" && {_seal_script(run_id, digest)}")


def seal_command(run_id: str, digest: str) -> str:
    """Shell for a node: seal RUN_ID's snapshot (just synced) with DIGEST."""
    return _sh(f"{_STATE}; {_seal_script(run_id, digest)}")


def _sh(script: str) -> str:
    return f"sh -c {shlex.quote(script)}"  # whatever the user's login shell is


def _seal_script(run_id: str, digest: str) -> str:
    """RUN_ID's snapshot sealed with DIGEST and its present state (in a new file: the
    previous snapshot's seal, hard-linked into this one, is left as it is)."""
    snap = f"{_node_state_root()}/{shlex.quote(run_id)}"
    return (f"s=$(state {snap}) && mkdir -p {snap}/{NODE_STATE_DIR} && rm -f {snap}/{SEAL} && "
            f"echo \"{digest} $s\" > {snap}/{SEAL}")


def _each(clients: dict[str, Connection], names: list[str], command: str
          ) -> dict[str, int]:
    """Run COMMAND on every named node at once; the exit code per node (-1: no answer)."""
    def one(name: str) -> int:
        try:
            return clients[name].run(command, timeout=60).exit_code
        except (OSError, TimeoutError):
            return -1
    return each(names, one, str).values_or_raise()


@dataclass(frozen=True)
class SyncResult:
    run_id: str
    seconds: float
    reused: list[str] = field(default_factory=list)  # nodes whose code was unchanged
    # node -> what the last run from this work directory wrote there, carried (carry.py)
    carried: dict[str, dict] = field(default_factory=dict)

    def carried_lines(self) -> list[str]:
        """What train says of the files carried from the last run (and of those the code
        has too, which keep the code's version)."""
        lines = []
        files = {n: c for n, c in self.carried.items() if c.get("carried")}
        if files:
            names = sorted({f for c in files.values() for f in c["carried"]})
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5
                                            else "")
            sources = sorted({c["from"] for c in files.values()})
            lines.append(f"{', '.join(sorted(files))}: the files the last run from this work "
                         f"directory wrote there ({', '.join(sources)}) are in this run's "
                         f"working directory too: {shown}")
        clash = {n: c["kept_code"] for n, c in self.carried.items() if c.get("kept_code")}
        for node, names in sorted(clash.items()):
            lines.append(f"{node}: the code has {', '.join(names[:5])} too and keeps its own; "
                         f"the last run's are in ~/{NODE_STATE_DIR}/{CODE_SUBDIR}/"
                         f"{self.carried[node]['from']}/")
        return lines


def sync_code(cluster: Cluster, workdir: Path, run_id: str, quiet: bool = True,
              clients: dict[str, Connection] | None = None,
              exclude: tuple[str, ...] = ()) -> SyncResult:
    """Make RUN_ID's snapshot of WORKDIR on every node. With CLIENTS (open connections
    to every node), nodes whose latest snapshot is sealed with the same code, untouched,
    get a linked copy of it, and the others' new snapshots are sealed after the sync."""
    workdir = workdir.resolve()
    if not workdir.is_dir():
        raise LaunchError(f"code directory {workdir} does not exist; pass --workdir DIR")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="clustertrain-sync-") as tmp:
        digest = code_digest(workdir, exclude) if clients else None
        carried = {} if digest is None or clients is None else \
            reuse_and_carry(cluster, workdir, run_id, digest, clients)
        reused = [n for n in cluster.names if n in carried]
        rest = [n for n in cluster.names if n not in reused]
        if rest:
            playbook = Path(tmp) / "project" / "sync.yml"
            playbook.parent.mkdir()
            playbook.write_text(yaml.safe_dump(
                sync_playbook(workdir, run_id, exclude), sort_keys=False))
            result = run_playbook(tmp, playbook, cluster.inventory, limit=",".join(rest),
                                  quiet=quiet, extravars={RSH_VAR: rsh(cluster, rest, clients)})
            if result.rc != 0:
                raise LaunchError("code sync failed (nothing was started):\n  " + "\n  ".join(
                    result.failures or result.output_tail.splitlines()
                    or [f"ansible-runner status {result.status}"]))
            # unsealed, a snapshot is only synced again next time
            if digest is not None and clients is not None:
                _each(clients, rest, seal_command(run_id, digest))
    if clients:
        carried.update(carry(cluster, workdir, run_id, clients, rest))
    return SyncResult(run_id, time.monotonic() - start, reused, carried)


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


def carry(cluster: Cluster, workdir: Path, run_id: str, clients: dict[str, Connection],
          names: list[str]) -> dict[str, dict]:
    """On each node of NAMES, what the last run from WORKDIR wrote into its working
    directory, into RUN_ID's snapshot (node/carry.py); what was carried, per node."""
    def one(name: str) -> dict:
        return _carried(name, nodelib.call(clients[name], cluster.node(name).python,
                                           rq.Carry(CARRY_ROOT, run_id, work_key(workdir)),
                                           timeout=300))

    return each(names, one, str).values_or_raise()


def reuse_and_carry(cluster: Cluster, workdir: Path, run_id: str, digest: str,
                    clients: dict[str, Connection]) -> dict[str, dict]:
    """The nodes whose latest snapshot is sealed with DIGEST and untouched: RUN_ID's
    snapshot linked from it (reuse_command), then the last run's files carried into it
    (carry), in one round trip per node; what was carried, per such node. The others
    (not in the answer) need the sync."""
    key = work_key(workdir)

    def one(name: str) -> dict | None:
        python = cluster.node(name).python
        both = _sh(f"{reuse_command(run_id, digest)} || exit {NOT_REUSED}; "
                   + nodelib.command(python, rq.Carry(CARRY_ROOT, run_id, key)))
        try:
            result = clients[name].run(both, timeout=300)
        except (OSError, TimeoutError):
            return None   # the sync tries the node again (and says what is wrong)
        if result.exit_code == NOT_REUSED:
            return None
        if result.exit_code == nodelib.MISSING:   # linked; the node lacks this version
            result = nodelib.call(clients[name], python, rq.Carry(CARRY_ROOT, run_id, key),
                                  timeout=300)
        return _carried(name, result)

    found = each(cluster.names, one, str).values_or_raise()
    return {n: c for n, c in found.items() if c is not None}


def _carried(name: str, result: Result) -> dict:
    """What `node.py carry` said it carried on node NAME (LaunchError if it failed)."""
    try:
        return nodelib.answer_of(result, name, "carry")
    except nodelib.NodeAnswerError as exc:
        raise LaunchError(f"{name}: could not carry the last run's files into the new "
                          f"snapshot: {exc.said}") from None
