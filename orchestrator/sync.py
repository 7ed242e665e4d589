"""Copy the training code to every node, into a per-run snapshot, with ansible-runner.

Each run gets ~/.clustertrain/code/<run-id>/ of the job user on every node (the play
never becomes root, whatever the inventory's ansible_become says: the code belongs to the
user who trains); rsync --link-dest against the previous snapshot (code/latest)
hard-links unchanged files, so a re-sync with no changes copies nothing, and editing
code locally never changes a job that is already running. Excludes follow the
.gitignore files of the code directory (rsync dir-merge filter). The worker runner
(run_worker.py, from this package's source) goes into every snapshot as
.clustertrain/run_worker.py, hard-linked like the rest when unchanged.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import run_worker
from .command import CODE_SUBDIR, NODE_STATE_DIR, WORKER_RUNNER
from .errors import LaunchError
from .inventory import Cluster
from .runner import run_playbook


def sync_playbook(workdir: Path, run_id: str, runner_dir: Path | None = None) -> list[dict]:
    """RUNNER_DIR: a local directory that holds WORKER_RUNNER, copied into the snapshot."""
    code_root = f"{NODE_STATE_DIR}/{CODE_SUBDIR}"   # relative to the user's home
    dest = f"{code_root}/{run_id}/"
    return [{
        "name": "Sync the training code into a per-run snapshot",
        "hosts": "train_nodes",
        "gather_facts": False,
        # Play vars outrank the inventory's ansible_become: the job user owns its code.
        "vars": {"ansible_become": False},
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
                 "use_ssh_args": True,
                 "link_dest": "{{ [previous.stat.lnk_source] if previous.stat.islnk | "
                              "default(false) else omit }}",
                 "rsync_opts": ["--filter=:-_.gitignore", "--exclude=.git/",
                                "--exclude=__pycache__/"],
             }},
            *([{"name": "Add the worker runner to the snapshot",
                "ansible.posix.synchronize": {
                    "src": f"{runner_dir}/", "dest": dest, "archive": True,
                    "use_ssh_args": True,
                    "link_dest": "{{ [previous.stat.lnk_source] if previous.stat.islnk | "
                                 "default(false) else omit }}"}}] if runner_dir else []),
            {"name": "Point 'latest' at this snapshot",
             "ansible.builtin.file": {"src": run_id, "dest": f"~/{code_root}/latest",
                                      "state": "link", "force": True}},
        ],
    }]


@dataclass(frozen=True)
class SyncResult:
    run_id: str
    seconds: float


def sync_code(cluster: Cluster, workdir: Path, run_id: str, quiet: bool = True) -> SyncResult:
    workdir = workdir.resolve()
    if not workdir.is_dir():
        raise LaunchError(f"code directory {workdir} does not exist; pass --workdir DIR")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="clustertrain-sync-") as tmp:
        playbook = Path(tmp) / "project" / "sync.yml"
        playbook.parent.mkdir()
        runner = Path(tmp) / "runner" / WORKER_RUNNER
        runner.parent.mkdir(parents=True)
        shutil.copy2(run_worker.__file__, runner)  # its mtime too: unchanged, it is linked
        playbook.write_text(yaml.safe_dump(sync_playbook(workdir, run_id, runner.parents[1]),
                                           sort_keys=False))
        result = run_playbook(tmp, playbook, cluster.inventory,
                              limit=",".join(cluster.names), quiet=quiet)
    if result.rc != 0:
        raise LaunchError("code sync failed (nothing was started):\n  "
                          + "\n  ".join(result.failures or result.output_tail.splitlines()
                                        or [f"ansible-runner status {result.status}"]))
    return SyncResult(run_id, time.monotonic() - start)
