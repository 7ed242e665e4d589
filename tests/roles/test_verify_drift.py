"""playbooks/verify.yml and the orchestrator's preflight report the same drift in the same
words: both take the comparison and the message from roles/python_env/files/fingerprint.py
(verify.yml through playbooks/filter_plugins/python_env_drift.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.checks.preflight import Report, _judge_drift
from orchestrator.checks.probe import NodeFacts
from orchestrator.cluster.inventory import Cluster, NodeSpec
from orchestrator.cluster.ssh import SshTarget

from .sources import REPO, load

fp = load("roles/python_env/files/fingerprint.py", "fingerprint_under_test")
drift_filter = load("playbooks/filter_plugins/python_env_drift.py", "python_env_drift")


def preflight_problems(inventory: Path, live: dict, provisioned: dict) -> list[str]:
    """What preflight's drift judgement says about nodes whose environments are LIVE
    ({node: fingerprint}) and were PROVISIONED ({node: fingerprint})."""
    facts = []
    for i, (name, fingerprint) in enumerate(live.items()):
        node = NodeSpec(name=name, ssh=SshTarget(host=f"192.0.2.{i + 1}", user="alice"),
                        cluster_address=f"192.0.2.{i + 1}")
        facts.append(NodeFacts(
            node, fingerprint=fingerprint, provisioned=provisioned.get(name),
            python_env={"python": "/v/bin/python", "torchrun": "/v/bin/torchrun"},
            torch={"ok": True, "version": "2.13.0+cpu", "gpus": 0, "torchrun": True},
            shared={"ok": True}, resolve={}, clock_offset=0.0, port_free=True,
            free_port=29500, user="alice", uid=1001, home="/home/alice"))
    report = Report(Cluster(inventory=inventory, nodes=tuple(f.node for f in facts)), facts)
    _judge_drift(report)
    return report.problems


def _fp(**packages) -> dict:
    return fp.seal({"python": "3.11.2", "packages": dict(packages), "torch": "2.13.0",
                    "cuda": None, "nccl": None, "driver": None, "lock": "ab"})


def test_the_verify_filter_and_preflight_give_the_same_message() -> None:
    live = {"node0": _fp(fsspec="2026.9.0", torch="2.13.0"),
            "node1": _fp(fsspec="2026.9.0", torch="2.13.0"),
            "node2": _fp(torch="2.13.0", mpmath="1.4.0")}
    provisioned = {"node0": live["node0"], "node1": live["node1"], "node2": live["node0"]}
    found = drift_filter.python_env_drift(live, provisioned, "/site/hosts.yml")
    [problem] = preflight_problems(Path("/site/hosts.yml"), live, provisioned)
    assert found["message"] == problem
    assert found["realign"] == ["node2"]
    assert found["command"] == "ansible-playbook site.yml -i /site/hosts.yml --limit node2"


def test_no_drift_no_message() -> None:
    same = {"node0": _fp(torch="2.13.0"), "node1": _fp(torch="2.13.0")}
    assert drift_filter.python_env_drift(same, same, "hosts.yml") == {
        "lines": [], "realign": [], "message": "", "command": ""}
    assert preflight_problems(Path("hosts.yml"), same, same) == []


def _environment(root: Path, packages: dict[str, str]) -> Path:
    """A node's state dir: python_env.json naming an environment (this interpreter runs it;
    the packages are what its metadata lists) and its fingerprint as provisioned."""
    site = root / "env" / "lib" / "python3.11" / "site-packages"
    for name, version in packages.items():
        d = site / f"{name}-{version}.dist-info"
        d.mkdir(parents=True)
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    state = root / "state"
    state.mkdir()
    (state / "python_env.json").write_text(json.dumps(
        {"backend": "venv", "prefix": str(root / "env"), "python": sys.executable}))
    return state


@pytest.mark.slow
def test_verify_playbook_prints_the_message_preflight_prints(tmp_path: Path) -> None:
    """The real playbooks/verify.yml on two local 'nodes', one of which lost a package after
    provisioning, against preflight's judgement of the same fingerprints."""
    states = {"node0": _environment(tmp_path / "node0", {"fsspec": "2026.9.0", "mpmath": "1.3.0"}),
              "node1": _environment(tmp_path / "node1", {"mpmath": "1.3.0"})}
    # node1 was provisioned like node0 (its fingerprint.json says so); fsspec went later.
    provisioned = fp.fingerprint(str(tmp_path / "node0" / "env"), sys.executable)
    for state in states.values():
        (state / "fingerprint.json").write_text(json.dumps(provisioned))
    live = {n: fp.fingerprint(str(s.parent / "env"), sys.executable) for n, s in states.items()}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "train_nodes:\n  hosts:\n"
        + "".join(f"    {n}: {{ansible_connection: local, python_env_state_dir: '{s}'}}\n"
                  for n, s in states.items()))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))

    def verify() -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory),
             "-e", f"ansible_python_interpreter={sys.executable}", "playbooks/verify.yml"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

    # node1 as provisioned: no drift, the play passes
    fsspec = tmp_path / "node1/env/lib/python3.11/site-packages/fsspec-2026.9.0.dist-info"
    fsspec.mkdir()
    (fsspec / "METADATA").write_text("Metadata-Version: 2.1\nName: fsspec\nVersion: 2026.9.0\n")
    clean = verify()
    assert clean.returncode == 0 and "same stack everywhere" in clean.stdout, clean.stdout
    assert "drift: none, problems: none" in clean.stdout
    # fsspec removed by hand on node1
    shutil.rmtree(fsspec)
    proc = verify()
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    [problem] = preflight_problems(inventory, live, {n: provisioned for n in live})
    assert "node1 since provisioning: package fsspec: 2026.9.0 when provisioned, absent now" \
        in problem
    # the failure's msg is printed as JSON: its line breaks are written \n
    said = " ".join(out.replace("\\n", "\n").split())
    assert " ".join(problem.split()) in said, out
