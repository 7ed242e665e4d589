"""`provision`: run site.yml on the cluster through ansible-runner, with progress and a recap."""

from __future__ import annotations

import re
import shlex
import tempfile
from pathlib import Path

import yaml

from ..cluster.playbook import run_playbook
from ..errors import ClusterError
from ..resources import project


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


KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What Ansible says when `become` (sudo) is refused on a host.
BECOME_FAILED = re.compile(r"Missing sudo password|a password is required|"
                           r"is not in the sudoers|not allowed to execute|Incorrect sudo password")


def check_extra_vars(item: str) -> None:
    """ClusterError unless ITEM is what ansible-playbook -e takes: KEY=VALUE words, a
    YAML/JSON mapping, or @FILE of one."""
    text = item.strip()
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        if not path.is_file():
            raise ClusterError(f"-e {item}: {path} does not exist; -e @FILE names a YAML or "
                               "JSON file of variables")
        return
    if text.startswith(("{", "[")):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ClusterError(f"-e {item!r} is not valid YAML/JSON ({exc}); give a mapping, "
                               "e.g. -e '{\"python_env_backend\": \"venv\"}'") from None
        if not isinstance(data, dict):
            raise ClusterError(f"-e {item!r} is not a mapping of variables; give e.g. "
                               "-e '{\"python_env_backend\": \"venv\"}'")
        return
    try:
        pairs = shlex.split(text)
    except ValueError as exc:
        raise ClusterError(f"-e {item!r}: {exc}") from None
    bad = [p for p in pairs if not KEY.fullmatch(p.partition("=")[0]) or "=" not in p]
    if not pairs or bad:
        raise ClusterError(f"-e {item!r} is not KEY=VALUE: {bad[0] if bad else 'empty'} sets no "
                           "variable; give e.g. -e python_env_backend=venv, a YAML mapping, "
                           "or @FILE")


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
        check_extra_vars(item)
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
        sudo = sorted({f.split(":")[0] for f in result.failures if BECOME_FAILED.search(f)})
        if sudo:
            detail = (f"becoming root failed on {', '.join(sudo)} (sudo asked for a password, "
                      "or the user may not use sudo): provisioning acts as root, so log in as a "
                      "user with passwordless sudo (ansible_become: true) or as root. Training "
                      "needs no root: users train as themselves")
        raise ProvisionError(f"{playbook} failed (ansible-runner status {result.status}, rc "
                             f"{result.rc}): {detail}")
    return stats


