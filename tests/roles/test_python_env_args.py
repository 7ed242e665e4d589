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


def test_keeping_no_state_is_refused_before_anything_runs(tmp_path):
    """python_env_keep 0 would remove the state the nodes are about to use."""
    result = run_role(tmp_path, {"python_env_keep": 0})
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "python_env_keep must keep at least the current state (1 or more; got '0')" in out
    assert "changed=0" in out and "Read the environment file" not in out, out


# --- the environment is usable by every user ---------------------------------------------

REPAIR_PLAYBOOK = """\
- hosts: all
  gather_facts: false
  tasks:
    - name: Check, repair and fingerprint an environment, as the role does after building it
      ansible.builtin.include_role:
        name: python_env
        tasks_from: fingerprint.yml
      vars:
        __python_env_prefix: "{{ env_prefix }}"
        python_env_home: "{{ env_home }}"
        python_env_state_dir: "{{ env_state }}"
        python_env_versioned: false
"""


def _private_tree(root: Path) -> None:
    """An environment as a restrictive umask (077) under sudo leaves it: root only."""
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "site-packages" / "pkg").mkdir(parents=True)
    (root / "lib" / "site-packages" / "pkg" / "__init__.py").write_text("")
    python = root / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (root / "bin" / "torchrun").write_text("#!/bin/sh\n")
    for path in [*root.rglob("*"), root]:
        path.chmod(0o700 if path.is_dir() or path.parent.name == "bin" else 0o600)


def test_an_environment_only_root_can_use_is_made_usable_by_every_user(tmp_path):
    env_prefix = tmp_path / "env"
    _private_tree(env_prefix)
    (tmp_path / "play.yml").write_text(REPAIR_PLAYBOOK)
    variables = {"env_prefix": str(env_prefix), "env_home": str(tmp_path / "home"),
                 "env_state": str(tmp_path / "state"), "python_env_backend": "venv"}
    (tmp_path / "home").mkdir()
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_ROLES_PATH=str(REPO / "roles"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
            "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
            "-e", json.dumps(variables), str(tmp_path / "play.yml")]

    first = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    for path in [env_prefix, *env_prefix.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        if path.is_dir() or path.parent.name == "bin":
            assert mode & 0o005 == 0o005, f"{path}: {oct(mode)}"
        else:
            assert mode & 0o004, f"{path}: {oct(mode)}"
    for name in ("python_env.json", "fingerprint.json"):
        assert (tmp_path / "state" / name).stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o755

    again = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "changed=0" in again.stdout, again.stdout
