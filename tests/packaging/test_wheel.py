"""`pip install .` (not editable) gives a working tool: the console script and
`python -m orchestrator` from any directory, with the playbooks and roles in the wheel."""

from __future__ import annotations

import zipfile

import pytest

pytestmark = pytest.mark.slow

VERBS = ("sandbox", "data", "preflight", "train", "attach", "stop", "runs", "logs",
         "provision", "wheelhouse")


def test_the_wheel_carries_the_playbooks_roles_and_sandbox_config(installed_tool):
    names = set(zipfile.ZipFile(installed_tool.wheel).namelist())
    shipped = "orchestrator/_project/"
    for role in ("common", "firewall", "miniconda", "nfs_client", "nfs_server",
                 "nvidia_driver", "python_env"):
        assert f"{shipped}roles/{role}/tasks/main.yml" in names
    for path in ("site.yml", "ansible.cfg", "environment.yml", "playbooks/base.yml",
                 "playbooks/verify.yml", "sandbox/containers.conf",
                 "sandbox/group_vars/all.yml", "roles/python_env/files/fingerprint.py",
                 "train/train.py", "playbooks/filter_plugins/python_env_drift.py",
                 *(f"collections/ansible_collections/clustertrain/cluster/plugins/{p}.py"
                   for p in ("filter/cluster_members", "modules/cluster_addresses",
                             "module_utils/cluster_contract"))):
        assert shipped + path in names, path
    assert "orchestrator/sandbox/cluster.py" in names   # subpackages too


@pytest.mark.parametrize("argv", [("clustertrain", "--help"),
                                  ("python", "-m", "orchestrator", "--help")])
def test_the_installed_tool_lists_its_verbs_from_any_directory(installed_tool, argv):
    proc = installed_tool.run(*argv)
    assert proc.returncode == 0, proc.stderr
    for verb in VERBS:
        assert f"    {verb}" in proc.stdout, (verb, proc.stdout)


def test_the_installed_tool_finds_its_own_playbooks(installed_tool):
    """Not the checkout's: provision names the playbook it would run, inside the venv."""
    proc = installed_tool.run("clustertrain", "provision", "-i", "/etc/hostname",
                              "--playbook", "no-such.yml")
    assert proc.returncode != 0
    assert f"{installed_tool.venv}/lib/" in proc.stderr, proc.stderr
    assert "orchestrator/_project/no-such.yml does not exist" in proc.stderr, proc.stderr
