"""python_env refuses, before anything runs, to have every node copy a wheelhouse onto the
NFS share as root (root is squashed there by default). Runs the real role with
ansible-playbook against localhost (connection local, check mode)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def run_role(tmp_path: Path, extra_vars: dict) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  roles:\n    - role: python_env\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_ROLES_PATH=str(REPO / "roles"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
            "-c", "local", "--check", "-e", f"ansible_python_interpreter={sys.executable}",
            "-e", json.dumps({"python_env_backend": "venv", **extra_vars}), str(playbook)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


@pytest.mark.parametrize("wheelhouse", ["/mnt/cluster/wheelhouse", "/mnt/cluster/"])
def test_copying_the_wheelhouse_onto_the_share_is_refused(tmp_path, wheelhouse):
    result = run_role(tmp_path, {"python_env_wheelhouse": wheelhouse,
                                 "python_env_wheelhouse_src": str(tmp_path)})
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "python_env_wheelhouse_src would make every node copy the wheels" in out, out
    assert "root is squashed" in out
    assert "changed=0" in out


def test_a_wheelhouse_on_the_share_without_copying_passes_the_check(tmp_path):
    result = run_role(tmp_path, {"python_env_wheelhouse": "/mnt/cluster/wheelhouse",
                                 "python_env_wheelhouse_src": ""})
    out = result.stdout + result.stderr
    assert "Refuse to copy the wheelhouse onto the shared directory" in out, out
    assert "python_env_wheelhouse_src would make" not in out, out
