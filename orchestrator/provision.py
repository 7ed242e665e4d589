"""`provision`: run site.yml on the cluster through ansible-runner, with progress and a recap."""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

from .errors import ClusterError
from .resources import project
from .runner import run_playbook


class ProvisionError(ClusterError):
    """site.yml failed on at least one host."""

    exit_code = 1


def _progress(event: dict) -> bool:
    kind, data = event.get("event"), event.get("event_data", {})
    if kind == "playbook_on_task_start":
        print(f"TASK {data.get('task')}", flush=True)
    elif kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
        msg = (data.get("res") or {}).get("msg") or ""
        print(f"  {data.get('host')}: {kind.split('_')[-1].upper()} {msg}".rstrip(), flush=True)
    return True


def provision(inventory: Path, limit: str | None = None, check: bool = False,
              tags: str | None = None, playbook: str = "site.yml",
              extra_vars: list[str] | None = None) -> dict:
    if not inventory.exists():
        raise ClusterError(f"inventory {inventory} does not exist; pass -i/--inventory")
    shipped = project()
    playbook_path = shipped.playbook(playbook)
    if not playbook_path.is_file():
        raise ClusterError(f"playbook {playbook_path} does not exist; --playbook is relative "
                           f"to the repository {shipped.root}")
    words = (["--check", "--diff"] if check else []) + (["--tags", tags] if tags else [])
    for item in extra_vars or []:
        words += ["-e", item]
    cmdline = shlex.join(words)
    with tempfile.TemporaryDirectory(prefix="clustertrain-provision-") as tmp:
        result = run_playbook(tmp, playbook_path, inventory, limit=limit,
                              cmdline=cmdline or None, event_handler=_progress)
    stats = result.stats
    hosts = sorted({h for part in stats.values() if isinstance(part, dict) for h in part})
    print("RECAP")
    for host in hosts:
        counts = {k: stats.get(k, {}).get(host, 0)
                  for k in ("ok", "changed", "failures", "dark", "skipped")}
        print(f"  {host:<16} ok={counts['ok']} changed={counts['changed']} "
              f"failed={counts['failures']} unreachable={counts['dark']} "
              f"skipped={counts['skipped']}")
    if result.rc != 0:
        detail = "see the failed tasks above" if result.failures else result.output_tail
        raise ProvisionError(f"{playbook} failed (ansible-runner status {result.status}, rc "
                             f"{result.rc}): {detail}")
    return stats


