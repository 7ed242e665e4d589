"""The tool as a user installs it: a wheel built from this checkout, installed offline from
a wheelhouse into a fresh virtualenv. Built once per state of the checkout (kept in the
user's cache directory, so make test's unit and sandbox stages build it once); the installed
tool's tests run it from `/`, where no checkout can be found by accident."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The ansible tools of the environment that runs the tests (the collection needs no venv).
BIN = Path(sys.executable).parent
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


# Outside the checkout: an installed tool under it could find the checkout's files by
# walking up from its own.
INSTALLED_CACHE = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                   / "clustertrain-tests" / "installed-tool")


def source_digest() -> str:
    """A digest of the checkout as git sees it (tracked and untracked files, not the
    ignored ones): the wheel is built from these, so an equal digest means an equal wheel."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True,
                            check=True, timeout=60).stdout
    digest = hashlib.sha256()
    for name in sorted(set(filter(None, listed.split(b"\0")))):
        path = REPO / os.fsdecode(name)
        if path.is_file():
            digest.update(name + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def installed_tool() -> InstalledTool:
    """clustertrain built as a wheel (not editable), its dependencies gathered into a
    wheelhouse with pip's own configuration (the local index here), and both installed
    into a fresh virtualenv with --no-index: the offline install of README's "Install".
    Kept in INSTALLED_CACHE/DIGEST while the checkout stays the same (source_digest);
    a lock lets one pytest worker build it while the others wait."""
    INSTALLED_CACHE.mkdir(parents=True, exist_ok=True)
    root = INSTALLED_CACHE / source_digest()
    with (INSTALLED_CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").is_file():
            for old in INSTALLED_CACHE.iterdir():   # other states of the checkout
                if old.is_dir():
                    shutil.rmtree(old)
            _install(root)
    wheel, = (root / "wheelhouse").glob("clustertrain-*.whl")
    return InstalledTool(wheel, root / "venv")


def _install(root: Path) -> None:
    started = time.monotonic()
    root.mkdir(parents=True)
    wheelhouse, venv = root / "wheelhouse", root / "venv"
    _pip(root, "wheel", "--no-deps", "--wheel-dir", str(wheelhouse), str(REPO))
    wheel, = wheelhouse.glob("clustertrain-*.whl")
    _pip(root, "download", "--dest", str(wheelhouse), str(wheel))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # --no-compile: compiling every module of ansible up front took 25 s of the 31; Python
    # compiles what the tool imports, once, on its first use.
    _pip(root, "install", "--no-compile", "--no-index", "--find-links", str(wheelhouse),
         "clustertrain", python=str(venv / "bin" / "python"))
    (root / "done").touch()
    print(f"\ninstalled_tool: wheel built and installed in {time.monotonic() - started:.0f} s",
          file=sys.stderr)


@dataclass(frozen=True)
class InstalledCollection:
    tarball: Path      # clustertrain-cluster-*.tar.gz, built by ansible-galaxy
    path: Path         # the collections path it is installed into

    def ansible(self, *argv: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
        """ansible-playbook or another tool ARGV[0] from CWD, outside the repository, with
        this collections path alone: nothing of the checkout (its ansible.cfg, roles_path,
        collections/) can stand in for the collection."""
        env = {**outside_env(), "ANSIBLE_COLLECTIONS_PATH": str(self.path),
               "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(cwd / ".ansible-tmp")}
        if (cwd / "ansible.cfg").is_file():
            env["ANSIBLE_CONFIG"] = str(cwd / "ansible.cfg")
        return subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def installed_collection(tmp_path_factory) -> InstalledCollection:
    """The roles as README's "Install" makes them a collection: `ansible-galaxy collection
    build` in the repository, `ansible-galaxy collection install --offline` of the tarball
    into a collections path of its own."""
    root = tmp_path_factory.mktemp("collection")
    dist, path = root / "dist", root / "collections"
    build = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build",
                            "--output-path", str(dist), str(REPO)], cwd=root,
                           env=outside_env(), capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    tarball, = dist.glob("clustertrain-cluster-*.tar.gz")
    install = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install",
                              "--offline", "-p", str(path), str(tarball)], cwd=root,
                             env=outside_env(), capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    return InstalledCollection(tarball, path)
