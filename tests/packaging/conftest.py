"""The tool as a user installs it: a wheel built from this checkout, installed offline from
a wheelhouse into a fresh virtualenv. Built once per session; the installed tool's tests
run it from `/`, where no checkout can be found by accident."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What the test session sets that would point the installed tool at the checkout.
OUTSIDE_ENV = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONTAINERS_CONF"}


def outside_env() -> dict[str, str]:
    """This environment less what points at the checkout (PYTHONPATH, ANSIBLE_CONFIG...)."""
    return {k: v for k, v in os.environ.items()
            if k not in OUTSIDE_ENV and not k.startswith("ANSIBLE_")}


@dataclass(frozen=True)
class InstalledTool:
    wheel: Path       # clustertrain-*.whl
    venv: Path        # the fresh virtualenv it is installed in

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def run(self, *argv: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        """ARGV with the virtualenv's bin/ (e.g. "clustertrain", "sandbox", "up"), from /,
        with an environment that points at nothing in the checkout."""
        env = outside_env()
        env.update(PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
                   **kwargs.pop("env", {}))
        return subprocess.run([str(self.bin / argv[0]), *argv[1:]], cwd="/", env=env,
                              capture_output=True, text=True, timeout=timeout, **kwargs)


def _pip(cwd: Path, *argv: str, python: str = sys.executable, timeout: float = 600) -> None:
    # Nothing of the checkout on sys.path (cwd, PYTHONPATH): pip would take its
    # clustertrain.egg-info (an editable install's) for an installed clustertrain.
    proc = subprocess.run([python, "-m", "pip", *argv, "--disable-pip-version-check", "-q"],
                          cwd=cwd, env=outside_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"pip {' '.join(argv)}:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="session")
def installed_tool(tmp_path_factory) -> InstalledTool:
    """clustertrain built as a wheel (not editable), its dependencies gathered into a
    wheelhouse with pip's own configuration (the local index here), and both installed
    into a fresh virtualenv with --no-index: the offline install of README's "Install"."""
    started = time.monotonic()
    root = tmp_path_factory.mktemp("installed")
    wheelhouse, venv = root / "wheelhouse", root / "venv"
    _pip(root, "wheel", "--no-deps", "--wheel-dir", str(wheelhouse), str(REPO))
    wheel, = wheelhouse.glob("clustertrain-*.whl")
    _pip(root, "download", "--dest", str(wheelhouse), str(wheel))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    _pip(root, "install", "--no-index", "--find-links", str(wheelhouse), "clustertrain",
         python=str(venv / "bin" / "python"))
    print(f"\ninstalled_tool: wheel built and installed in {time.monotonic() - started:.0f} s",
          file=sys.stderr)
    return InstalledTool(wheel, venv)
