"""The miniconda role, run for real by ansible-playbook against this machine (connection
local) with every path inside pytest's tmp_path.

Miniconda itself cannot be downloaded here, so the installer is a TEST DOUBLE: a small
shell script that honours `-b -p PREFIX` like the real one and creates PREFIX/bin/conda.
The role's own logic (checksum before anything runs, controller-side file, URL download,
cleanup on failure, managed .condarc, idempotence) is what these tests exercise.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# Runs ansible-playbook or pip for real: seconds to a minute each.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "ansible-playbook"

# TEST DOUBLE of the Miniconda installer: same command line (-b -p PREFIX), makes
# PREFIX/bin/conda and records how it was called.
FAKE_INSTALLER = """#!/bin/bash
# TEST DOUBLE of a Miniconda installer (clustertrain tests): honours -b -p PREFIX.
set -e
batch=no; prefix=
while [ $# -gt 0 ]; do
  case "$1" in
    -b) batch=yes ;;
    -p) prefix="$2"; shift ;;
  esac
  shift
done
[ "$batch" = yes ] && [ -n "$prefix" ] || { echo "usage: -b -p PREFIX" >&2; exit 2; }
[ -e "$prefix" ] && { echo "ERROR: File or directory already exists: $prefix" >&2; exit 1; }
mkdir -p "$prefix/bin"
printf '#!/bin/sh\\necho "conda 24.9.2 (test double)"\\n' > "$prefix/bin/conda"
chmod +x "$prefix/bin/conda"
echo "$@ batch=$batch prefix=$prefix" >> "$(dirname "$0")/../calls.log" 2>/dev/null || true
"""

# TEST DOUBLE of an installer that breaks half-way, after writing into PREFIX.
BROKEN_INSTALLER = """#!/bin/bash
# TEST DOUBLE of a Miniconda installer that fails after a partial install.
mkdir -p "$3/pkgs" && echo partial > "$3/pkgs/partial"
echo "installer crashed (test double)" >&2
exit 1
"""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Run:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.rc = proc.returncode
        self.out = proc.stdout + proc.stderr

    def changed(self) -> int:
        for line in self.out.splitlines():
            if line.startswith("localhost") and "changed=" in line:
                return int(line.split("changed=")[1].split()[0])
        raise AssertionError(f"no recap in output:\n{self.out}")


@pytest.fixture()
def env(tmp_path: Path):
    (tmp_path / "dl").mkdir()
    (tmp_path / "ctl").mkdir()

    def run(*options: str, **role_vars) -> Run:
        play = [{"name": "miniconda role test", "hosts": "localhost", "connection": "local",
                 "gather_facts": False,
                 "vars": {"ansible_python_interpreter": sys.executable},
                 "roles": [{"role": "miniconda",
                            "miniconda_prefix": str(tmp_path / "conda"),
                            "miniconda_download_dir": str(tmp_path / "dl"),
                            **role_vars}]}]
        book = tmp_path / "play.yml"
        book.write_text(yaml.safe_dump(play))
        proc = subprocess.run(
            [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", *options, str(book)],
            cwd=REPO, capture_output=True, text=True, timeout=300,
            env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                 "ANSIBLE_ROLES_PATH": str(REPO / "roles"), "ANSIBLE_NOCOLOR": "1",
                 "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_STDOUT_CALLBACK": "default"})
        return Run(proc)

    return tmp_path, run


def _installer(tmp_path: Path, text: str = FAKE_INSTALLER) -> Path:
    path = tmp_path / "ctl" / "Miniconda3-test-double.sh"
    path.write_text(text)
    return path


def test_controller_file_is_installed_with_managed_condarc_and_is_idempotent(env):
    tmp_path, run = env
    installer = _installer(tmp_path)
    result = run(miniconda_installer_src=str(installer),
                 miniconda_installer_sha256=_sha256(installer),
                 miniconda_installer_url="http://127.0.0.1:9/never-used.sh",
                 miniconda_channels=["conda-forge", "pytorch"])
    assert result.rc == 0, result.out
    conda = tmp_path / "conda" / "bin" / "conda"
    assert subprocess.run([str(conda)], capture_output=True, text=True).stdout.startswith(
        "conda 24.9.2 (test double)")
    condarc = yaml.safe_load((tmp_path / "conda" / ".condarc").read_text())
    assert condarc["channels"] == ["conda-forge", "pytorch"]
    assert condarc["channel_priority"] == "strict"
    assert condarc["auto_update_conda"] is False
    assert list((tmp_path / "dl").iterdir()) == [], "installer left behind on the node"
    assert "batch=yes prefix=" + str(tmp_path / "conda") in (tmp_path / "calls.log").read_text()

    again = run(miniconda_installer_src=str(installer),
                miniconda_installer_sha256=_sha256(installer),
                miniconda_channels=["conda-forge", "pytorch"])
    assert again.rc == 0, again.out
    assert again.changed() == 0, again.out
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 1, "installer ran twice"


def test_wrong_checksum_of_controller_file_fails_before_anything_is_installed(env):
    tmp_path, run = env
    installer = _installer(tmp_path)
    result = run(miniconda_installer_src=str(installer), miniconda_installer_sha256="0" * 64)
    assert result.rc != 0
    assert "did not match miniconda_installer_sha256" in result.out, result.out
    assert "Nothing was installed" in result.out
    assert not (tmp_path / "conda").exists()
    assert list((tmp_path / "dl").iterdir()) == []
    assert not (tmp_path / "calls.log").exists(), "the installer ran despite a bad checksum"


def test_wrong_checksum_of_download_fails_and_leaves_nothing(env):
    tmp_path, run = env
    installer = _installer(tmp_path)
    result = run(miniconda_installer_url=installer.as_uri(), miniconda_installer_sha256="1" * 64)
    assert result.rc != 0
    assert "miniconda_installer_sha256 do not belong together" in result.out, result.out
    assert "did not match" in result.out
    assert not (tmp_path / "conda").exists()
    assert list((tmp_path / "dl").iterdir()) == []
    assert not (tmp_path / "calls.log").exists()


def test_download_with_right_checksum_installs(env):
    tmp_path, run = env
    installer = _installer(tmp_path)
    result = run(miniconda_installer_url=installer.as_uri(),
                 miniconda_installer_sha256=_sha256(installer))
    assert result.rc == 0, result.out
    assert (tmp_path / "conda" / "bin" / "conda").is_file()
    assert list((tmp_path / "dl").iterdir()) == []


def test_failing_installer_leaves_no_partial_install(env):
    tmp_path, run = env
    installer = _installer(tmp_path, BROKEN_INSTALLER)
    result = run(miniconda_installer_src=str(installer),
                 miniconda_installer_sha256=_sha256(installer))
    assert result.rc != 0
    assert "Miniconda was not installed" in result.out, result.out
    assert not (tmp_path / "conda").exists(), "partial install left behind"
    assert list((tmp_path / "dl").iterdir()) == []


def test_bad_checksum_format_names_the_variable(env):
    tmp_path, run = env
    result = run(miniconda_installer_src=str(_installer(tmp_path)),
                 miniconda_installer_sha256="abc")
    assert result.rc != 0
    assert "miniconda_installer_sha256 must be the installer's sha256" in result.out, result.out
    assert not (tmp_path / "conda").exists()


def test_existing_foreign_prefix_is_not_touched(env):
    tmp_path, run = env
    (tmp_path / "conda").mkdir()
    (tmp_path / "conda" / "precious").write_text("user data")
    installer = _installer(tmp_path)
    result = run(miniconda_installer_src=str(installer),
                 miniconda_installer_sha256=_sha256(installer))
    assert result.rc != 0
    assert "holds no bin/conda" in result.out, result.out
    assert (tmp_path / "conda" / "precious").read_text() == "user data"



def test_check_mode_reports_the_install_and_changes_nothing(env):
    tmp_path, run = env
    installer = _installer(tmp_path)
    result = run("--check", miniconda_installer_src=str(installer),
                 miniconda_installer_sha256=_sha256(installer))
    assert result.rc == 0, result.out
    assert result.changed() >= 1, "check mode should report the pending install"
    assert not (tmp_path / "conda").exists()
    assert list((tmp_path / "dl").iterdir()) == []
