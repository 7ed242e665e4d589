"""`env create`'s conda path (a cluster whose inventory sets python_env_backend: conda):
playbooks/user_env.yml run for real by ansible-playbook against this machine (connection
local, no become), in a home of the test's, with a wheelhouse built by the `wheelhouse` verb;
the environment then listed by the node package (orchestrator/node/envs.py).

Miniconda cannot be downloaded here, so `conda` is a TEST DOUBLE (FAKE_CONDA): it honours
`conda env create|update --file F --prefix P [--prune]` as the role calls them. Everything
around it is the real path: the playbook and the python_env role, the key and directory of
the state, the locked pip install into the environment (hashes checked), the fingerprint,
the drift check that decides whether conda runs at all. The venv path runs on the sandbox
(test_userenv_sandbox.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.node import envs
from orchestrator.node.protocol import ENVS_DIR

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]
ENV_FILE = """\
name: tools
dependencies:
  - python=3.11
  - numpy=2.1
  - pip
  - pip:
      - tabulate==0.10.0
"""

# TEST DOUBLE of conda (clustertrain tests), called as the python_env role calls conda:
#   conda env create --file F --prefix P
#   conda env update --file F --prefix P --prune
# P gets a python (a venv of the test's python), one conda-meta/ record per conda dependency
# of F (name-version-build.json, as conda names them; update --prune drops the records F no
# longer asks for), and F's pip: section installed by pip, which reads the index or
# wheelhouse from the PIP_* variables the role sets, as conda's pip step does. Each call is
# appended to calls.json beside this script.
FAKE_CONDA = """#!{python}
import json, os, subprocess, sys, venv
import yaml

here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(here, "calls.log"), "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
assert args[:2] in (["env", "create"], ["env", "update"]), args
spec = yaml.safe_load(open(args[args.index("--file") + 1]))
prefix = args[args.index("--prefix") + 1]
if args[1] == "create":
    venv.create(prefix, with_pip=True)
meta = os.path.join(prefix, "conda-meta")
os.makedirs(meta, exist_ok=True)
wanted = {{}}
for dep in spec["dependencies"]:
    if isinstance(dep, str):
        name, _, version = dep.partition("=")
        wanted[name] = version or "1.0"
if "--prune" in args:
    for record in os.listdir(meta):
        if record.rsplit("-", 2)[0] not in wanted:
            os.remove(os.path.join(meta, record))
for name, version in wanted.items():
    open(os.path.join(meta, f"{{name}}-{{version}}-0.json"), "w").write("{{}}")
pip = [d for d in spec["dependencies"] if isinstance(d, dict)]
if pip:
    subprocess.run([os.path.join(prefix, "bin", "python"), "-m", "pip", "install", "-q",
                    *pip[0]["pip"]], check=True)
"""


@pytest.fixture
def site(tmp_path: Path) -> dict[str, Path]:
    """A home, a conda (the double) and a wheelhouse built from the file by `wheelhouse`."""
    conda = tmp_path / "miniconda"
    (conda / "bin").mkdir(parents=True)
    (conda / "bin" / "conda").write_text(FAKE_CONDA.format(python=sys.executable))
    (conda / "bin" / "conda").chmod(0o755)
    spec = tmp_path / "tools.yml"
    spec.write_text(ENV_FILE)
    wheels = tmp_path / "wheelhouse"
    built = subprocess.run([sys.executable, "-m", "orchestrator", "wheelhouse", "--env",
                            str(spec), "--dest", str(wheels)], cwd=REPO, capture_output=True,
                           text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (tmp_path / "home").mkdir()
    return {"conda": conda, "spec": spec, "wheels": wheels, "home": tmp_path / "home",
            "tmp": tmp_path}


# Loaded by every Python the play starts (its modules too): a link made at the name of the
# environment waits 2 s first, so that nodes linking it at once meet there every time.
SLOW_LINK = """import os, time
_symlink = os.symlink
def _slow(src, dst, *args, **kwargs):
    if os.fsdecode(dst).endswith("/.clustertrain/envs/tools"):
        time.sleep(2)
    return _symlink(src, dst, *args, **kwargs)
os.symlink = _slow
"""


def env_create(site: dict[str, Path], hosts: str = "localhost,",
               slow_link: bool = False) -> subprocess.CompletedProcess[str]:
    """playbooks/user_env.yml as `env create -f tools.yml --wheelhouse W` runs it, on HOSTS
    (each one this machine, through a local connection); SLOW_LINK: with SLOW_LINK loaded."""
    tmp = site["tmp"]
    variables = {"user_env_hosts": "all", "user_env_file": str(site["spec"]),
                 "user_env_name": "tools", "user_env_wheelhouse": str(site["wheels"]),
                 "user_env_nonce": "0123abcd", "python_env_backend": "conda",
                 "python_env_conda_prefix": str(site["conda"])}
    env = dict(os.environ, HOME=str(site["home"]), ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"),
               ANSIBLE_REMOTE_TEMP=str(tmp / "ansible-tmp"))
    if slow_link:
        (tmp / "slow-link").mkdir(exist_ok=True)
        (tmp / "slow-link" / "sitecustomize.py").write_text(SLOW_LINK)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(tmp / "slow-link"), os.environ.get("PYTHONPATH")) if p)
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", hosts,
            "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
            "-e", json.dumps(variables), str(REPO / "playbooks" / "user_env.yml")]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)


def bytecode(prefix: Path, package: str) -> list[Path]:
    """The compiled modules of PACKAGE in the environment at PREFIX."""
    return list(prefix.glob(f"lib/python*/site-packages/{package}/__pycache__/*.pyc"))


def calls(site: dict[str, Path]) -> list[list[str]]:
    log = site["conda"] / "calls.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_users_conda_environment_is_made_once_and_put_back_when_it_drifts(
        site: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    first = env_create(site)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    [state] = [p for p in (site["home"] / ENVS_DIR).iterdir()
               if p.name.startswith("tools-")]
    prefix = state / "conda"
    assert calls(site) == [["env", "create", "--file", str(state / "environment.yml"),
                            "--prefix", str(prefix)]]
    # Installed without bytecode (a user's own environment: faster, and Python keeps the
    # bytecode of what is imported, the first time), which the first import then writes.
    assert not bytecode(prefix, "tabulate")
    # The pip section is there, from the wheelhouse and as locked.
    have = subprocess.run([str(prefix / "bin" / "python"), "-c",
                           "import tabulate; print(tabulate.__version__)"],
                          capture_output=True, text=True, check=True, env={
                              k: v for k, v in os.environ.items()
                              if k != "PYTHONDONTWRITEBYTECODE"})
    assert have.stdout.strip() == "0.10.0"
    assert bytecode(prefix, "tabulate")
    fingerprint = json.loads((state / "fingerprint.json").read_text())
    assert fingerprint["conda"]["numpy"] == "2.1=0"
    assert fingerprint["packages"]["tabulate"] == "0.10.0"
    assert os.readlink(site["home"] / ENVS_DIR / "tools") == state.name

    # The node package lists it as `env list` shows it: complete, conda, the newest.
    monkeypatch.setenv("HOME", str(site["home"]))
    [listed] = envs.list_envs("tools")["envs"]
    assert (listed["key"], listed["backend"], listed["current"], listed["complete"]) == (
        state.name.split("-")[-1], "conda", True, True)

    # The same file again: conda is not called.
    again = env_create(site)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    assert len(calls(site)) == 1, calls(site)
    assert '"made": false' in again.stdout and "changed=0" in again.stdout, \
        again.stdout[-3000:]

    # A package installed by hand with conda (its record in conda-meta/): the environment
    # drifted, and the next env create puts it back with `conda env update --prune`.
    (prefix / "conda-meta" / "scipy-1.14.1-0.json").write_text("{}")
    repaired = env_create(site)
    assert repaired.returncode == 0, repaired.stdout[-4000:] + repaired.stderr[-2000:]
    assert calls(site)[1:] == [["env", "update", "--file", str(state / "environment.yml"),
                                "--prefix", str(prefix), "--prune"]]
    assert not (prefix / "conda-meta" / "scipy-1.14.1-0.json").exists()
    assert '"made": true' in repaired.stdout, repaired.stdout[-3000:]
    assert "scipy" not in json.loads((state / "fingerprint.json").read_text())["conda"]


def test_nodes_that_share_a_home_make_the_environment_once(site: dict[str, Path]) -> None:
    """Two nodes with one home between them (NFS homes; here two inventory names of this
    machine): the first by name makes the environment, the other uses it, conda runs once.
    The two nodes' tasks run at the same moment: with the link to the environment made
    slowly (SLOW_LINK), both would find it missing and the second fail to make it."""
    both = env_create(site, hosts="nodeA,nodeB,", slow_link=True)
    assert both.returncode == 0, both.stdout[-4000:] + both.stderr[-2000:]
    assert [c[:2] for c in calls(site)] == [["env", "create"]], calls(site)
    recap = both.stdout[both.stdout.rindex("PLAY RECAP"):]
    assert re.search(r"nodeA +: .* failed=0 ", recap) and re.search(r"nodeB +: .* failed=0 ",
                                                                    recap), recap
    assert '"shared_with": "nodeA"' in both.stdout, both.stdout[-4000:]
    assert not list((site["home"] / ENVS_DIR).glob(".mark-*"))   # the marks are cleared


def cluster_env(site: dict[str, Path], spec: Path) -> subprocess.CompletedProcess[str]:
    """The python_env role as site.yml runs it for the cluster's environment (states on,
    the default), with the conda backend, every path under the test's directory."""
    tmp = site["tmp"]
    play = tmp / "cluster_env.yml"
    play.write_text("- hosts: all\n  gather_facts: true\n  roles:\n    - role: python_env\n")
    variables = {"python_env_file": str(spec), "python_env_backend": "conda",
                 "python_env_conda_prefix": str(site["conda"]),
                 "python_env_home": str(tmp / "opt"), "python_env_state_dir": str(tmp / "etc"),
                 "python_env_wheelhouse": str(site["wheels"]), "python_env_os_packages": False}
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_ROLES_PATH=str(REPO / "roles"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"))
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
            "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
            "-e", json.dumps(variables), str(play)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)


def test_the_clusters_conda_environment_is_a_state_per_file_and_the_old_one_stays(
        site: dict[str, Path]) -> None:
    """site.yml's python_env with conda: each file its own state under envs/, made with
    `conda env create --prefix`; python_env.json names the newest and conda's usual
    envs/NAME links to it; the previous state stays (a run may use it), and going back to
    it calls conda no more."""
    opt, published = site["tmp"] / "opt" / "envs", site["tmp"] / "etc" / "python_env.json"
    first = cluster_env(site, site["spec"])
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    [a] = list(opt.iterdir())
    assert json.loads(published.read_text())["prefix"] == str(a / "conda")
    assert calls(site) == [["env", "create", "--file", str(a / "environment.yml"),
                            "--prefix", str(a / "conda")]]
    link = site["conda"] / "envs" / "tools"
    assert link.resolve() == a / "conda"
    # Compiled at install: its users cannot write the bytecode of what they import.
    assert bytecode(a / "conda", "tabulate")
    changed = site["tmp"] / "changed.yml"
    changed.write_text(ENV_FILE.replace("numpy=2.1", "numpy=2.2"))
    second = cluster_env(site, changed)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-2000:]
    [b] = [p for p in opt.iterdir() if p != a]
    assert json.loads(published.read_text())["prefix"] == str(b / "conda")
    assert json.loads((b / "fingerprint.json").read_text())["conda"]["numpy"] == "2.2=0"
    assert json.loads((a / "fingerprint.json").read_text())["conda"]["numpy"] == "2.1=0"
    assert link.resolve() == b / "conda" and (a / "conda" / "bin" / "python").exists()
    back = cluster_env(site, site["spec"])
    assert back.returncode == 0, back.stdout[-4000:] + back.stderr[-2000:]
    assert [c[:2] for c in calls(site)] == [["env", "create"]] * 2, calls(site)
    assert json.loads(published.read_text())["prefix"] == str(a / "conda")
    assert link.resolve() == a / "conda" and sorted(opt.iterdir()) == sorted([a, b])
