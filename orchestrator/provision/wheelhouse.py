"""`python -m orchestrator wheelhouse`: the pip: section of environment.yml as local wheels.

A wheelhouse is built once on the controller (`pip download`) and installed on nodes
with `pip install --no-index --find-links DIR`: what air-gapped clusters need, and much
faster than every node fetching torch on its own. A stamp file records what the
wheelhouse was built from, so a second build with the same inputs does nothing.

A lock (LOCK) records the sha256 of every file, and the requirement lines with hashes
that the python_env role installs with `pip install --require-hashes`: a wheel changed
after the build (on the share, say) is refused by name on the nodes. A second build checks
the files against the lock and refuses a changed one here too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ClusterError, InputError
from ..record.rundir import check_writable
from .envfile import read_environment

STAMP = ".clustertrain-wheelhouse.json"
LOCK = "clustertrain-lock.json"


class WheelhouseError(ClusterError):
    """The environment file cannot be read, or its pip: section cannot be downloaded."""


@dataclass(frozen=True)
class EnvironmentSpec:
    """What a conda-style environment.yml asks for."""

    name: str
    channels: tuple[str, ...]
    conda: tuple[str, ...]
    pip: tuple[str, ...]


@dataclass(frozen=True)
class WheelhouseRequest:
    env_file: Path
    dest: Path
    python_version: str | None = None
    platform: str | None = None
    extra_index_url: str | None = None

    def key(self, spec: EnvironmentSpec) -> str:
        """Hash of everything that decides the wheelhouse's content."""
        inputs = {"pip": list(spec.pip), "python_version": self.python_version,
                  "platform": self.platform, "extra_index_url": self.extra_index_url}
        blob = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class WheelhouseResult:
    dest: Path
    files: list[str] = field(default_factory=list)
    up_to_date: bool = False
    python_version: str = ""                 # the Python the wheels are for
    conda_only: tuple[str, ...] = ()         # what the file asks conda for: not in here


PYTHON_LINE = re.compile(r"^\s*python\s*(?:==?|\s)\s*(\d+\.\d+)(?:\.[\d*]+)?\*?\s*$")
NOT_CONDA_PACKAGES = re.compile(r"^\s*(python|pip)\s*([=<>!~ ].*)?$")


def python_of(spec: EnvironmentSpec) -> str | None:
    """The X.Y the file's `python=X.Y[.Z]` line asks for (None: it names none)."""
    for dep in spec.conda:
        found = PYTHON_LINE.match(dep)
        if found:
            return found.group(1)
    return None


def target_python(request: WheelhouseRequest, spec: EnvironmentSpec) -> WheelhouseRequest:
    """The request with the Python the wheels are for: --python-version, else the file's
    python= line (pip then takes wheels only, and resolves for the oldest patch release
    the line admits: a wheelhouse built with Python 3.11.7 here must install on a node's
    3.11.2, where a package that needs >=3.11.5 would not), else this machine's. A
    --python-version that contradicts the file is refused."""
    wanted = python_of(spec)
    given = request.python_version
    if given and wanted and not (given + ".").startswith(wanted + "."):
        raise WheelhouseError(f"--python-version {given} contradicts {request.env_file}, which "
                              f"asks for python {wanted}; give --python-version {wanted}, or "
                              "change the file's python= line")
    if not given and wanted:
        return dataclasses.replace(request, python_version=wanted)
    return request


def load_environment(path: Path) -> EnvironmentSpec:
    """Parse and check a conda-style environment file."""
    if not path.exists():
        raise WheelhouseError(f"environment file {path} does not exist; pass the repository's "
                              "environment.yml with --env")
    try:
        found = read_environment(path, f"environment file {path}", "an environment file in "
                                 "conda's format (name, channels, dependencies)")
    except InputError as exc:
        raise WheelhouseError(str(exc)) from None
    if found.conda is None:
        raise WheelhouseError(f"environment file {path} has no 'dependencies:' list; write it "
                              "in conda's format (name, channels, dependencies with a pip: "
                              "section)")
    return EnvironmentSpec(name=found.name or "", channels=found.channels, conda=found.conda,
                           pip=found.pip)


def _read_stamp(dest: Path) -> dict:
    try:
        return json.loads((dest / STAMP).read_text())
    except (OSError, ValueError):
        return {}


def is_up_to_date(request: WheelhouseRequest, spec: EnvironmentSpec) -> bool:
    stamp = _read_stamp(request.dest)
    return (stamp.get("key") == request.key(spec)
            and bool(stamp.get("files"))
            and all((request.dest / f).is_file() for f in stamp["files"]))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def name_version(filename: str) -> tuple[str, str]:
    """Project name (canonical) and version from a wheel or sdist file name."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return _canonical(parts[0]), parts[1]
    stem = re.sub(r"\.(tar\.gz|tar\.bz2|zip|tgz)$", "", filename)
    name, _, version = stem.rpartition("-")
    return _canonical(name), version


def read_lock(dest: Path) -> dict:
    try:
        return json.loads((dest / LOCK).read_text())
    except (OSError, ValueError):
        return {}


def write_lock(dest: Path, files: list[str], spec: EnvironmentSpec, env_file: Path) -> dict:
    """Hash every file of the wheelhouse; the requirement lines pin each project to its
    version with the hashes of its files (pip --require-hashes)."""
    wheels = []
    for name in sorted(files):
        project, version = name_version(name)
        wheels.append({"file": name, "name": project, "version": version,
                       "sha256": sha256_file(dest / name)})
    grouped: dict[tuple[str, str], list[str]] = {}
    for w in wheels:
        grouped.setdefault((w["name"], w["version"]), []).append(w["sha256"])
    lock = {"format": 1, "env_file": str(env_file), "pip": list(spec.pip), "wheels": wheels,
            "requirements": [f"{n}=={v} " + " ".join(f"--hash=sha256:{h}" for h in hashes)
                             for (n, v), hashes in sorted(grouped.items())]}
    tmp = dest / f".{LOCK}.tmp"
    tmp.write_text(json.dumps(lock, indent=2) + "\n")
    os.replace(tmp, dest / LOCK)
    return lock


def verify_lock(dest: Path, lock: dict) -> list[str]:
    """The files of DEST whose sha256 is not the one in LOCK, with both hashes."""
    bad = []
    for w in lock.get("wheels", []):
        path = dest / w["file"]
        got = sha256_file(path) if path.is_file() else "missing"
        if got != w["sha256"]:
            bad.append(f"{w['file']}: expected sha256 {w['sha256']}, got {got}")
    return bad


def _pip_download(request: WheelhouseRequest, spec: EnvironmentSpec, into: Path) -> None:
    reqs = into / "requirements.txt"
    reqs.write_text("".join(f"{line}\n" for line in spec.pip))
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
           "--dest", str(into), "-r", str(reqs)]
    if request.dest.is_dir():
        # Wheels already in the old wheelhouse are copied, not fetched again.
        cmd += ["--find-links", str(request.dest)]
    if request.python_version or request.platform:
        cmd.append("--only-binary=:all:")
    if request.python_version:
        cmd += ["--python-version", request.python_version]
    if request.platform:
        cmd += ["--platform", request.platform]
    if request.extra_index_url:
        cmd += ["--extra-index-url", request.extra_index_url]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    reqs.unlink()
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise WheelhouseError(
            f"pip download of the pip: section of {request.env_file} failed:\n{tail}\n"
            "Fix the requirement in that file, or point --extra-index-url at an index "
            "that has it (e.g. https://download.pytorch.org/whl/cu128 for CUDA torch)")


def build(request: WheelhouseRequest) -> WheelhouseResult:
    """Download the environment's pip: section into request.dest unless already there,
    as wheels for the Python the file asks for (target_python)."""
    spec = load_environment(request.env_file)
    if not spec.pip:
        raise WheelhouseError(f"environment file {request.env_file} has no pip: packages; "
                              "add a '- pip:' list under dependencies (e.g. torch==2.13.0)")
    request = target_python(request, spec)
    check_writable(request.dest, "--dest")
    result = _build(request, spec)
    result.python_version = request.python_version or "%d.%d" % sys.version_info[:2]
    result.conda_only = tuple(d for d in spec.conda if not NOT_CONDA_PACKAGES.match(d))
    return result


def _build(request: WheelhouseRequest, spec: EnvironmentSpec) -> WheelhouseResult:
    if is_up_to_date(request, spec):
        files = sorted(_read_stamp(request.dest)["files"])
        lock = read_lock(request.dest)
        if sorted(w["file"] for w in lock.get("wheels", [])) != files:
            write_lock(request.dest, files, spec, request.env_file)  # built before locks
        else:
            bad = verify_lock(request.dest, lock)
            if bad:
                raise WheelhouseError(
                    f"the wheelhouse {request.dest} does not match its lock ({LOCK}): "
                    + "; ".join(bad) + ". A file was changed after the wheelhouse was built: "
                    "delete it and run wheelhouse again (the nodes refuse it as it is)")
        return WheelhouseResult(request.dest, files, True)
    if request.dest.exists() and not request.dest.is_dir():
        raise WheelhouseError(f"{request.dest} exists and is not a directory; choose another "
                              "--dest")
    request.dest.parent.mkdir(parents=True, exist_ok=True)
    old = set(_read_stamp(request.dest).get("files", []))
    with tempfile.TemporaryDirectory(prefix=".wheelhouse-", dir=request.dest.parent) as tmp:
        _pip_download(request, spec, Path(tmp))
        files = sorted(p.name for p in Path(tmp).iterdir() if p.is_file())
        request.dest.mkdir(exist_ok=True)
        for name in files:
            os.replace(Path(tmp) / name, request.dest / name)
    for name in old - set(files):
        (request.dest / name).unlink(missing_ok=True)
    stamp = {"key": request.key(spec), "env_file": str(request.env_file),
             "pip": list(spec.pip), "files": files}
    (request.dest / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    write_lock(request.dest, files, spec, request.env_file)
    return WheelhouseResult(request.dest, files, False)


__all__ = ["LOCK", "EnvironmentSpec", "WheelhouseError", "WheelhouseRequest", "WheelhouseResult",
           "build", "load_environment", "is_up_to_date", "read_lock", "verify_lock"]
