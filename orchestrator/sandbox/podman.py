"""Run podman with the repository's containers.conf."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from ..errors import SandboxError
from ..resources import project


def podman_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = str(project().containers_conf)
    return env


def require_podman() -> str:
    path = shutil.which("podman")
    if path is None:
        raise SandboxError(
            "podman is not installed; the sandbox cluster runs its nodes as podman containers.\n"
            "Install it with: sudo apt-get install -y podman runc debootstrap"
        )
    return path


def podman(args: Sequence[str], *, check: bool = True, input: bytes | None = None,
           timeout: float | None = 120) -> subprocess.CompletedProcess[str]:
    """Run `podman ARGS`; on failure raise SandboxError with podman's own message."""
    cmd = [require_podman(), *args]
    proc = subprocess.run(cmd, env=podman_env(), input=input, capture_output=True,
                          timeout=timeout)
    result = subprocess.CompletedProcess(cmd, proc.returncode,
                                         proc.stdout.decode(errors="replace"),
                                         proc.stderr.decode(errors="replace"))
    if check and result.returncode != 0:
        raise SandboxError(f"`podman {' '.join(args)}` failed (exit {result.returncode}):\n"
                           f"{result.stderr.strip() or result.stdout.strip()}")
    return result


def podman_json(args: Sequence[str]) -> Any:
    out = podman(args).stdout.strip()
    return json.loads(out) if out else []
