"""orchestrator.provision.wheelhouse: environment file parsing and real `pip download` runs.

The downloads are real: torch 2.13.0 (CPU build) comes from pip's configured find-links on
this machine, its dependencies from pip's configured indexes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import ClusterError
from orchestrator.provision.wheelhouse import (
    STAMP,
    WheelhouseError,
    WheelhouseRequest,
    build,
    load_environment,
)

# Runs pip for real: seconds each.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def _env(tmp_path: Path, pip: list[str], name: str = "environment.yml") -> Path:
    lines = ["name: test", "channels: [conda-forge]", "dependencies:", "  - python=3.11",
             "  - pip", "  - pip:"] + [f"      - {p}" for p in pip]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_repository_environment_file_pins_torch_and_python():
    spec = load_environment(REPO / "environment.yml")
    assert spec.name == "clustertrain"
    assert "python=3.11" in spec.conda
    assert "torch==2.13.0" in spec.pip
    # what training scripts import beside torch, pinned like torch (torch warns on every
    # rank when numpy is missing)
    assert {"numpy", "pandas", "tqdm", "pyyaml"} <= {p.split("==")[0] for p in spec.pip
                                                     if "==" in p}


@pytest.mark.parametrize("text, fragment", [
    ("name: x\n", "has no 'dependencies:' list"),
    ("name: x\ndependencies: [python=3.11, {pop: [a]}]\n",
     "line 2: dependencies.1. must be a package string or a 'pip:' list, not a mapping"),
    ("name: x\ndependencies: [\n", "is not valid YAML"),
])
def test_bad_environment_files_are_named_with_the_fix(tmp_path, text, fragment):
    path = tmp_path / "environment.yml"
    path.write_text(text)
    with pytest.raises(WheelhouseError, match=fragment) as err:
        load_environment(path)
    assert str(path) in str(err.value)
    assert isinstance(err.value, ClusterError)


def test_missing_environment_file(tmp_path):
    with pytest.raises(WheelhouseError, match="does not exist; pass .* with --env"):
        build(WheelhouseRequest(tmp_path / "nope.yml", tmp_path / "wh"))
    assert not (tmp_path / "wh").exists()


def test_environment_without_pip_section_is_refused(tmp_path):
    path = tmp_path / "environment.yml"
    path.write_text("name: x\ndependencies: [python=3.11]\n")
    with pytest.raises(WheelhouseError, match="has no pip: packages"):
        build(WheelhouseRequest(path, tmp_path / "wh"))


def test_torch_wheelhouse_is_built_then_skipped_by_the_cli(tmp_path):
    env = _env(tmp_path, ["torch==2.13.0"])
    dest = tmp_path / "wheelhouse"
    cmd = [sys.executable, "-m", "orchestrator", "wheelhouse", "--env", str(env),
           "--dest", str(dest)]
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "built" in first.stdout
    wheels = sorted(p.name for p in dest.glob("*.whl"))
    assert any(w.startswith("torch-2.13.0+cpu-cp311") for w in wheels), wheels
    assert any(w.startswith("sympy-") for w in wheels), "torch's dependencies are missing"
    stamp = json.loads((dest / STAMP).read_text())
    assert sorted(stamp["files"]) == wheels
    mtimes = {p.name: p.stat().st_mtime_ns for p in dest.iterdir()}

    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    assert "up to date" in second.stdout
    assert {p.name: p.stat().st_mtime_ns for p in dest.iterdir()} == mtimes

    # pip resolves torch from the wheelhouse alone, as nodes do (--no-index).
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(dest),
         "--target", str(tmp_path / "site"), "--dry-run", "torch==2.13.0"],
        capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    assert "torch-2.13.0+cpu" in install.stdout


def test_changed_requirements_rebuild_and_drop_old_wheels(tmp_path):
    dest = tmp_path / "wh"
    first = build(WheelhouseRequest(_env(tmp_path, ["typing-extensions"], "a.yml"), dest))
    assert not first.up_to_date
    assert any(f.startswith("typing_extensions-") for f in first.files)

    second = build(WheelhouseRequest(_env(tmp_path, ["filelock"], "b.yml"), dest))
    assert not second.up_to_date
    names = sorted(p.name for p in dest.glob("*.whl"))
    assert any(n.startswith("filelock-") for n in names)
    assert not any(n.startswith("typing_extensions-") for n in names), names

    again = build(WheelhouseRequest(_env(tmp_path, ["filelock"], "b.yml"), dest))
    assert again.up_to_date


def test_unavailable_requirement_fails_with_pip_reason_and_fix(tmp_path):
    env = _env(tmp_path, ["torch==0.0.1"])
    with pytest.raises(WheelhouseError) as err:
        build(WheelhouseRequest(env, tmp_path / "wh"))
    message = str(err.value)
    assert str(env) in message
    assert "torch" in message
    assert "--extra-index-url" in message
    assert not (tmp_path / "wh").exists()
    assert not list(tmp_path.glob(".wheelhouse-*")), "download directory left behind"
