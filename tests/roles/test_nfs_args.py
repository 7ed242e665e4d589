"""Bad variables for the nfs_server and nfs_client roles fail before anything is changed,
with a message that names the variable.

Runs the real roles with ansible-playbook against localhost (connection=local, check mode),
so nothing on this machine is touched. `--tags` names a tag no task has: only the roles'
argument validation and their `always`-tagged checks run, which is also what proves that
the checks come before the first change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Runs ansible-playbook or pip for real: seconds to a minute each.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")

# Valid settings for running the roles on localhost, which is in no inventory group.
SERVER_OK = {"nfs_server_extra_clients": ["10.0.0.0/24"]}
CLIENT_OK = {"nfs_client_server": "127.0.0.1"}


def run_role(tmp_path: Path, role: str, extra_vars: dict, *, only_checks: bool = True
             ) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        f"- hosts: all\n  gather_facts: false\n  roles:\n    - role: {role}\n")
    env = dict(os.environ,
               ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_ROLES_PATH=str(REPO / "roles"),
               ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    argv = [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", "--check",
            "-e", f"ansible_python_interpreter={sys.executable}",
            "-e", json.dumps(extra_vars), str(playbook)]
    if only_checks:
        argv[1:1] = ["--tags", "no-such-tag"]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)


def assert_fails_naming(result: subprocess.CompletedProcess[str], *words: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode != 0, f"expected a failure, got rc=0:\n{output}"
    for word in words:
        assert word in output, f"{word!r} not in the error:\n{output}"
    # Nothing beyond the checks ran: no host was changed.
    assert "changed=0" in output, output


@pytest.mark.parametrize(("extra", "words"), [
    ({"nfs_server_implementation": "nfsd"},
     ["nfs_server_implementation", "nfsd", "kernel", "ganesha"]),
    ({"nfs_server_export_path": "srv/nfs/cluster"},
     ["nfs_server_export_path must be an absolute path", "srv/nfs/cluster"]),
    ({"nfs_server_export_path": "/"},
     ["nfs_server_export_path must be an absolute path"]),
    ({"nfs_server_extra_clients": ["10.0.0.1/24"]},
     ["nfs_server_extra_clients", "10.0.0.1/24"]),
    ({"nfs_server_extra_clients": ["10.0.0.0/33", "10.0.0.0/24"]},
     ["nfs_server_extra_clients", "10.0.0.0/33"]),
    ({"nfs_server_extra_clients": ["*.example.com"]},
     ["nfs_server_extra_clients", "*.example.com"]),
    ({"nfs_server_extra_clients": []},
     ["admit no client", "nfs_server_client_group", "nfs_server_extra_clients"]),
    ({"nfs_server_squash": "squash_everything"},
     ["nfs_server_squash", "squash_everything"]),
    ({"nfs_server_kernel_exports_file": "/etc/exports.d/cluster"},
     ["nfs_server_kernel_exports_file"]),
    ({"nfs_server_subdirectories": [{"path": "checkpoints", "mode": 1777}]},
     ["nfs_server_subdirectories", "checkpoints", "in quotes"]),
    ({"nfs_server_subdirectories": ["data", {"path": "../outside"}]},
     ["nfs_server_subdirectories", "relative path inside the export"]),
    ({"nfs_server_user_directories": ["alice", "../etc"]},
     ["nfs_server_user_directories", "must list user names", "../etc"]),
])
def test_server_rejects_bad_variables(tmp_path, extra, words):
    assert_fails_naming(run_role(tmp_path, "nfs_server", {**SERVER_OK, **extra}), *words)


@pytest.mark.parametrize(("extra", "words"), [
    ({"nfs_client_mount_path": "mnt/cluster"},
     ["nfs_client_mount_path must be an absolute path", "mnt/cluster"]),
    ({"nfs_client_export_path": "srv/nfs/cluster"},
     ["nfs_client_export_path must be the absolute path"]),
    ({"nfs_client_nfs_version": "3"},
     ["nfs_client_nfs_version", "4.2"]),
    ({"nfs_client_nconnect": 32},
     ["nfs_client_nconnect must be between 0 and 16"]),
    ({"nfs_client_server": ""},
     ["No NFS server", "nfs_client_server", "nfs_client_server_group"]),
    ({"nfs_client_server": "10.0.0.1; rm -rf /"},
     ["nfs_client_server", "is not a host name or IP address"]),
])
def test_client_rejects_bad_variables(tmp_path, extra, words):
    assert_fails_naming(run_role(tmp_path, "nfs_client", {**CLIENT_OK, **extra}), *words)


@pytest.mark.parametrize(("role", "extra"), [
    ("nfs_server", SERVER_OK),
    ("nfs_server", {"nfs_server_implementation": "ganesha", "nfs_server_squash": "no_root_squash",
                    "nfs_server_extra_clients": ["192.0.2.7", "2001:db8::/64"],
                    "nfs_server_secure": False, "cluster_users": ["alice", "j.doe"]}),
    ("nfs_server", {**SERVER_OK, "nfs_server_subdirectories": [
        "data", {"path": "checkpoints", "mode": "1777"}, {"path": "teams/vision", "mode": "2775",
                                                          "group": "vision"}]}),
    ("nfs_client", CLIENT_OK),
    ("nfs_client", {"nfs_client_server": "nfs.example.internal",
                    "nfs_client_nfs_version": "4.1", "nfs_client_nconnect": 0}),
])
def test_good_variables_pass_the_checks(tmp_path, role, extra):
    result = run_role(tmp_path, role, extra)
    assert result.returncode == 0, result.stdout + result.stderr
