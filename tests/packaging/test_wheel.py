"""`pip install .` (not editable) gives a working tool: the console script and
`python -m orchestrator` from any directory, with the playbooks and roles in the wheel."""

from __future__ import annotations

import json
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
    assert "orchestrator/report/templates/run.html.j2" in names   # package data


def test_the_installed_tool_draws_a_runs_report(installed_tool, tmp_path):
    """Its templates come with it: `runs report` from / writes the page."""
    from tests.orchestrator.report.recorded import write_run
    run = write_run(tmp_path, "20260921-000000-7ee1ed", ["node0", "node1"], 60)
    run.report_html.unlink()
    proc = installed_tool.run("clustertrain", "runs", "report", run.run_id, "--runs-dir",
                              str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "<svg" in run.report_html.read_text()


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


# Run by the installed python from /: the plugins as Ansible loads them (by path, from the
# wheel's copies) and the orchestrator's contract, each finding its shared file in the wheel.
SHARED_FILES = """\
import importlib.util, json
from orchestrator import contract
from orchestrator.resources import project

def load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

shipped = project()
members = load(shipped.collection / "plugins/filter/cluster_members.py")
drift = load(shipped.root / "playbooks/filter_plugins/python_env_drift.py")
def env(**packages):
    return drift.fingerprint.seal({"python": "3.11.2", "packages": packages, "torch": "2.13.0",
                                   "cuda": None, "nccl": None, "driver": None, "lock": "ab"})
print(json.dumps({
    "root": str(shipped.root),
    "contract": [contract.member_address("n1", {"cluster_address": " 10.0.0.1 "}),
                 contract.is_ip("[2001:db8::1]")],
    "filter": members.common_member_address("n2", {"n2": {"ansible_host": "gpu2"}}),
    "drift": drift.python_env_drift({"n1": env(torch="2.13.0", fsspec="2026.9.0"),
                                     "n2": env(torch="2.13.0")},
                                    {"n1": env(torch="2.13.0"), "n2": env(torch="2.13.0")},
                                    "hosts.yml")["command"],
}))
"""


def test_the_installed_plugins_and_contract_find_their_shared_files_in_the_wheel(
        installed_tool):
    proc = installed_tool.run("python", "-c", SHARED_FILES)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["root"].startswith(f"{installed_tool.venv}/lib/"), result
    assert result["contract"] == ["10.0.0.1", True]
    assert result["filter"] == "gpu2"
    assert result["drift"] == "ansible-playbook site.yml -i hosts.yml --limit n1"


def test_the_installed_node_package_finds_the_roles_files_it_is_made_of(installed_tool):
    """orchestrator.node.health (and cordon, untrusted, fingerprint) are the roles' files:
    in an install, the wheel's copy of them, which the node package's bundle carries."""
    proc = installed_tool.run("python", "-c", (
        "import json\n"
        "from orchestrator.node import cordon, fingerprint, health, untrusted\n"
        "from orchestrator.cluster import nodelib\n"
        "files = dict(nodelib._files())\n"
        "print(json.dumps({m.__name__: [m.__file__, files['orchestrator/node/'\n"
        "    + m.__name__.rsplit('.', 1)[1] + '.py'] == open(m.__file__, 'rb').read()]\n"
        "    for m in (cordon, fingerprint, health, untrusted)}))\n"))
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    for name, role in (("cordon", "slurm"), ("fingerprint", "python_env"),
                       ("health", "health"), ("untrusted", "slurm")):
        path, carried = found[f"orchestrator.node.{name}"]
        assert path.startswith(f"{installed_tool.venv}/lib/"), path
        assert path.endswith(f"orchestrator/_project/roles/{role}/files/{name}.py"), path
        assert carried, name
