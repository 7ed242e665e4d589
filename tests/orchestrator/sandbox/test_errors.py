"""Error paths of the sandbox: each names the problem and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import SandboxError
from orchestrator.sandbox import image
from orchestrator.sandbox.image import ImageRecipe

REPO = Path(__file__).resolve().parents[3]


def run_cli(*args: str, env_path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=REPO,
                          capture_output=True, text=True, env={"PATH": env_path, "HOME": "/tmp"})


def test_missing_podman_says_how_to_install(tmp_path):
    proc = run_cli("sandbox", "up", "--name", "nopodman", env_path=str(tmp_path))
    assert proc.returncode != 0
    assert "podman is not installed" in proc.stderr
    assert "apt-get install -y podman" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_debootstrap_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxError, match="apt-get install -y debootstrap"):
        image._build(tmp_path, ImageRecipe(mirror="http://127.0.0.1:9/debian"), log=lambda *_: None)


def test_image_build_failure_names_the_failing_step(tmp_path):
    # A mirror nobody listens on (loopback port 9): debootstrap itself fails.
    with pytest.raises(SandboxError) as err:
        image._build(tmp_path, ImageRecipe(mirror="http://127.0.0.1:9/debian"), log=lambda *_: None)
    assert "failed at step 'debootstrap'" in str(err.value)
    assert "127.0.0.1" in str(err.value)  # debootstrap's own complaint is shown
    assert not list(tmp_path.glob("image-build-*")), "the half-built root file system is removed"


def test_bad_name_is_refused_before_anything_runs(tmp_path):
    proc = run_cli("sandbox", "up", "--name", "Bad_Name", env_path=str(tmp_path))
    assert proc.returncode == 2
    assert "invalid sandbox name 'Bad_Name'" in proc.stderr
