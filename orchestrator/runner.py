"""Run a playbook through ansible-runner with the project's ansible.cfg.

The ansible-playbook next to the running Python is used (a virtualenv's bin/ need not
be on PATH), and when a run fails before any task reports, ansible's own output is
returned so that the error can name the cause.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .resources import project


@dataclass(frozen=True)
class PlaybookResult:
    rc: int
    status: str
    stats: dict
    failures: list[str]   # "host: message" for each failed or unreachable task
    output_tail: str      # ansible's last lines, for failures outside any task


def run_playbook(private_data_dir: str, playbook: Path, inventory: Path, *,
                 limit: str | None = None, cmdline: str | None = None, quiet: bool = True,
                 event_handler: Callable[[dict], bool] | None = None) -> PlaybookResult:
    import ansible_runner  # slow import: only when a playbook runs

    bindir = Path(sys.executable).parent
    shipped = project()
    result = ansible_runner.run(
        private_data_dir=private_data_dir, project_dir=str(shipped.root),
        playbook=str(playbook), inventory=str(inventory.resolve()), limit=limit,
        cmdline=cmdline, quiet=quiet, event_handler=event_handler,
        envvars={"ANSIBLE_CONFIG": str(shipped.ansible_cfg),
                 "ANSIBLE_ROLES_PATH": str(shipped.roles),
                 "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"},
        settings={"suppress_ansible_output": quiet})
    failures = [f"{e['event_data'].get('host')}: "
                f"{(e['event_data'].get('res') or {}).get('msg', '')}".strip()
                for e in result.events
                if e.get("event") in ("runner_on_failed", "runner_on_unreachable")
                and not e["event_data"].get("ignore_errors")]
    tail = ""
    if result.rc != 0 and result.stdout is not None:
        tail = "\n".join(result.stdout.read().strip().splitlines()[-15:])
    return PlaybookResult(result.rc, result.status, result.stats or {}, failures, tail)
