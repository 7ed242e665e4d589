"""Run a playbook through ansible-runner with the project's ansible.cfg.

The ansible-playbook next to the running Python is used (a virtualenv's bin/ need not
be on PATH), and when a run fails before any task reports, ansible's own output is
returned so that the error can name the cause.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..resources import project


@contextlib.contextmanager
def _interruptible() -> Iterator[list[str]]:
    """While the block runs, Ctrl-C, SIGTERM and SIGHUP are noted in the list it gives
    (ansible-runner's cancel callback reads it and stops the playbook); a second Ctrl-C
    raises KeyboardInterrupt at once. Outside the main thread, signals stay as they are."""
    said: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield said
        return
    names: dict[int, str] = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM",
                             signal.SIGHUP: "SIGHUP"}

    def handler(signum: int, frame: object) -> None:  # noqa: ARG001
        if said and signum == signal.SIGINT:
            raise KeyboardInterrupt(said[0])
        said.append(names.get(signum, str(signum)))

    previous = {sig: signal.signal(sig, handler) for sig in names}
    try:
        yield said
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@dataclass(frozen=True)
class PlaybookResult:
    rc: int
    status: str
    stats: dict
    failures: list[str]   # "host: message" for each failed or unreachable task
    output_tail: str      # ansible's last lines, for failures outside any task


def run_playbook(private_data_dir: str, playbook: Path, inventory: Path, *,
                 limit: str | None = None, cmdline: str | None = None, quiet: bool = True,
                 extravars: dict | None = None,
                 event_handler: Callable[[dict], bool] | None = None) -> PlaybookResult:
    """Run PLAYBOOK; Ctrl-C (or SIGTERM, SIGHUP) stops ansible-playbook and raises
    KeyboardInterrupt here once it has ended (a second Ctrl-C: at once)."""
    import ansible_runner  # slow import: only when a playbook runs

    bindir = Path(sys.executable).parent
    shipped = project()
    with _interruptible() as interrupted:
        result = ansible_runner.run(
            private_data_dir=private_data_dir, project_dir=str(shipped.root),
            playbook=str(playbook), inventory=str(inventory.resolve()), limit=limit,
            cmdline=cmdline, quiet=quiet, extravars=extravars, event_handler=event_handler,
            cancel_callback=lambda: bool(interrupted),
            envvars={"ANSIBLE_CONFIG": str(shipped.ansible_cfg),
                     "ANSIBLE_ROLES_PATH": str(shipped.roles),
                     # Messages are read by people and tests, not terminals: no colour codes.
                     "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0",
                     "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"},
            settings={"suppress_ansible_output": quiet})
    if interrupted:
        raise KeyboardInterrupt(interrupted[0])
    failures = [f"{e['event_data'].get('host')}: "
                f"{(e['event_data'].get('res') or {}).get('msg', '')}".strip()
                for e in result.events
                if e.get("event") in ("runner_on_failed", "runner_on_unreachable")
                and not e["event_data"].get("ignore_errors")]
    tail = ""
    if result.rc != 0 and result.stdout is not None:
        tail = "\n".join(result.stdout.read().strip().splitlines()[-15:])
    return PlaybookResult(result.rc, result.status, result.stats or {}, failures, tail)
