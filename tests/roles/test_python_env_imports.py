"""An environment is ready only once the packages its file names import (python_env's
importcheck.py, run with the environment's python, and the role's tasks/imports.yml):
a real venv made here, real wheels installed into it by pip, one whose package raises
ImportError as a torchvision built for another torch does."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

# Makes a venv and runs pip (and ansible-playbook): seconds each.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "roles" / "python_env" / "files" / "importcheck.py"
# What a torchvision built for another torch says at its import.
MISMATCH = "RuntimeError: operator torchvision::nms does not exist"


def wheel(into: Path, project: str, modules: dict[str, str]) -> Path:
    """A wheel of PROJECT 1.0 holding MODULES ({path: source}), as a build tool makes it
    (no top_level.txt: the import names come from its RECORD)."""
    dist = f"{project.replace('-', '_')}-1.0.dist-info"
    files = {**modules,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: 1.0\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    record = "".join(
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).decode().rstrip('=')},"
        f"{len(t.encode())}\n" for p, t in files.items()) + f"{dist}/RECORD,,\n"
    path = into / f"{project.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in {**files, f"{dist}/RECORD": record}.items():
            zf.writestr(name, text)
    return path


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with three packages installed by pip: good-pkg (module goodpkg), vision-fake
    (module visionfake, which fails to import as a mismatched torchvision does) and
    two-mods (modules twomods and _twomods_native)."""
    root = tmp_path_factory.mktemp("importcheck")
    prefix = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    wheels = [
        wheel(root, "good-pkg", {"goodpkg/__init__.py": "VERSION = '1.0'\n"}),
        wheel(root, "vision-fake", {"visionfake/__init__.py":
                                    "import goodpkg\nraise RuntimeError("
                                    "'operator torchvision::nms does not exist')\n"}),
        wheel(root, "two-mods", {"twomods.py": "", "_twomods_native.py": ""}),
    ]
    subprocess.run([sys.executable, "-m", "pip", "--python", str(prefix / "bin" / "python"),
                    "install", "--no-index", "--no-deps", "--disable-pip-version-check",
                    "--quiet", *map(str, wheels)], check=True)
    return prefix


def check(prefix: Path, *argv: str) -> tuple[int, dict]:
    p = subprocess.run([str(prefix / "bin" / "python"), str(CHECK), *argv],
                       capture_output=True, text=True, timeout=60, cwd=prefix)
    return p.returncode, json.loads(p.stdout.strip().splitlines()[-1])


def test_a_package_that_does_not_import_is_named_with_its_own_last_error_line(
        venv: Path) -> None:
    code, report = check(venv, "--conda=python=3.11", "--conda=cudatoolkit", "--conda=pip",
                         "--pip=--extra-index-url https://example.org/simple",
                         "--pip=Good_Pkg>=1.0", "--pip=vision-fake==1.0; python_version>'3'",
                         "--pip=two-mods")
    assert code == 1, report
    assert report["failed"] == [{"package": "vision-fake", "module": "visionfake",
                                 "error": MISMATCH}]
    assert report["imported"] == {"good-pkg": ["goodpkg"], "two-mods": ["twomods"]}
    # named by the file, not a distribution here (conda's own, or the interpreter)
    assert report["not_installed"] == ["cudatoolkit"]


def test_packages_that_import_pass(venv: Path) -> None:
    code, report = check(venv, "--pip=good-pkg", "--pip=two-mods")
    assert code == 0 and report["failed"] == [], report


IMPORTS_PLAYBOOK = """\
- hosts: all
  gather_facts: false
  tasks:
    - name: Check the environment's packages, as the role does once it is realised
      ansible.builtin.include_role:
        name: python_env
        tasks_from: imports.yml
      vars:
        __python_env_prefix: "{{ env_prefix }}"
        __python_env_dir: "{{ env_dir }}"
        __python_env_pip: ["good-pkg", "vision-fake==1.0"]
        __python_env_conda_deps: ["python=3.11", "pip"]
"""


def test_the_role_fails_naming_the_node_the_package_and_its_error(venv: Path,
                                                                  tmp_path: Path) -> None:
    playbook = tmp_path / "play.yml"
    playbook.write_text(IMPORTS_PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_ROLES_PATH=str(REPO / "roles"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    p = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i",
                        "node7,", "-c", "local", "-e",
                        f"ansible_python_interpreter={sys.executable}", "-e",
                        json.dumps({"env_prefix": str(venv), "env_dir": str(tmp_path)}),
                        str(playbook)], capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert ("The environment's packages do not all import on node7, so it is not ready: "
            f"vision-fake (import visionfake): {MISMATCH}.") in out, out
    assert "pin versions of them built for each other" in out, out
