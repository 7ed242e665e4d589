"""`env create|list|rm` on the controller (orchestrator/provision/userenv.py): the file and
name checks made before any node is touched, and how the nodes' answers are merged."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.cluster.inventory import Cluster
from orchestrator.errors import InventoryError
from orchestrator.node.answers import EnvsAnswer
from orchestrator.provision import userenv
from orchestrator.provision.userenv import EnvError, EnvFile

REPO = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "env.yml"
    path.write_text(text)
    return path


def test_the_projects_environment_file_is_read() -> None:
    env = EnvFile.read(REPO / "environment.yml")
    assert env.name == "clustertrain"
    assert env.conda == ("python=3.11", "pip")
    assert any(p.startswith("torch==") for p in env.pip)
    env.refuse_for("venv")   # python and pip: what a venv honours


def test_conda_packages_on_a_cluster_without_conda_are_refused_naming_them(
        tmp_path: Path) -> None:
    env = EnvFile.read(write(tmp_path, "name: x\ndependencies:\n  - python=3.11\n  - numpy=2.1\n"
                             "  - cudatoolkit\n  - pip\n  - pip: [tabulate]\n"))
    env.refuse_for("conda")
    with pytest.raises(EnvError) as err:
        env.refuse_for("venv")
    assert "asks conda for numpy=2.1, cudatoolkit" in str(err.value)
    assert "pip: section" in str(err.value) and "no node was touched" in str(err.value)


def test_a_create_refused_on_the_controller_touches_no_node(tmp_path: Path) -> None:
    """The refusal comes before any connection: the cluster's only node cannot be reached."""
    from orchestrator.cluster.inventory import NodeSpec
    from orchestrator.cluster.ssh import SshTarget
    cluster = Cluster(tmp_path / "hosts.yml", (NodeSpec("node0", SshTarget("192.0.2.1"),
                                                        "192.0.2.1"),),
                      variables={"python_env_backend": "venv"})
    env = EnvFile.read(write(tmp_path, "name: x\ndependencies: [numpy, pip]\n"))
    with pytest.raises(EnvError, match="asks conda for numpy"):
        userenv.create(cluster, env, "x", None, say=lambda _: None)
    ok = EnvFile.read(write(tmp_path, "name: x\ndependencies: [pip]\n"))
    with pytest.raises(EnvError, match="--wheelhouse wh: give the directory as the nodes"):
        userenv.create(cluster, ok, "x", "wh", say=lambda _: None)
    with pytest.raises(InventoryError, match="environment name .a b.: an environment.s name"):
        userenv.create(cluster, ok, "a b", None, say=lambda _: None)
    with pytest.raises(EnvError, match="--keep 0: keep at least the newest state"):
        userenv.create(cluster, ok, "x", None, keep=0, say=lambda _: None)


@pytest.mark.parametrize("text, said", [
    ("dependencies: [pip]\n", "needs 'name:'"),
    ("name: x\n", "needs 'name:' and a 'dependencies:' list"),
    ("name: [x\n", "is not valid YAML"),
])
def test_a_file_that_is_no_environment_file_is_refused(tmp_path: Path, text: str,
                                                       said: str) -> None:
    with pytest.raises(EnvError, match=said):
        EnvFile.read(write(tmp_path, text))
    with pytest.raises(EnvError, match="give the environment file"):
        EnvFile.read(tmp_path / "missing.yml")


def test_the_nodes_answers_are_merged_by_name_and_key() -> None:
    now = time.time()

    def env(key: str, current: bool, size: int, used: float | None = None,
            pids: list[int] | None = None) -> dict:
        return {"name": "proj", "key": key, "dir": f"/h/proj-{key}", "current": current,
                "complete": True, "backend": "venv", "packages": 3, "size": size,
                "last_used": used, "in_use": pids or [], "fingerprint": "f" + key}

    states = userenv.merge({
        "node0": EnvsAnswer.from_json({"envs": [env("aaa", False, 10, now - 7200),
                                                env("bbb", True, 30)]}),
        "node1": EnvsAnswer.from_json({"envs": [env("bbb", True, 20, now - 5, [42])]}),
    })
    assert [(s.key, s.nodes, s.current) for s in states] == [
        ("bbb", ["node0", "node1"], ["node0", "node1"]), ("aaa", ["node0"], [])]
    assert states[0].size == 30 and states[0].in_use == {"node1": [42]}
    text = userenv.render(states, ["node0", "node1"]).splitlines()
    assert text[0].split() == ["NAME", "KEY", "NODES", "SIZE", "LAST", "USED", "IN", "USE"]
    assert text[1].split()[:4] == ["proj", "*", "bbb", "2/2"]
    assert "node1: 1 process(es)" in text[1] and "s ago" in text[1]
    assert text[2].split()[:3] == ["proj", "aaa", "1/2"] and "(node0)" in text[2]
    assert "2 h ago" in text[2]
    assert "no environments of yours" in userenv.render([], ["node0"])


def test_an_unfinished_create_is_listed_as_such_with_what_to_do() -> None:
    """An env create interrupted on node1: the state is there on node0 whole, on node1
    unfinished; the list says so and how to finish or remove it."""
    whole = {"name": "proj", "key": "ccc", "dir": "/h/proj-ccc", "current": True,
             "backend": "venv", "packages": 3, "size": 10, "last_used": None,
             "in_use": [], "fingerprint": "fff", "complete": True}
    states = userenv.merge({"node0": EnvsAnswer.from_json({"envs": [whole]}),
                            "node1": EnvsAnswer.from_json({"envs": [dict(
                                whole, current=False, fingerprint="", complete=False)]})})
    assert states[0].incomplete == ["node1"] and states[0].fingerprints == {"fff"}
    text = userenv.render(states, ["node0", "node1"])
    assert "2/2 (unfinished on node1)" in text.splitlines()[1]
    assert "env create with the same file finishes it, env rm NAME --key KEY" in text


def test_nodes_whose_environments_differ_fail_the_create_naming_node_and_package() -> None:
    """A package another version on node1 (its index gave another one): env create fails,
    naming node1 and the package."""
    def report(tabulate: str) -> dict:
        packages = {"torch": "2.13.0", "tabulate": tabulate}
        return {"key": "abcabcabcabc", "made": True, "fingerprint": {
            "python": "3.11.2", "packages": packages, "sha256": tabulate}}
    same = userenv.Created("proj", {"node0": report("0.10.0"), "node1": report("0.10.0")})
    same.check_identical()
    differ = userenv.Created("proj", {"node0": report("0.10.0"), "node1": report("0.9.0")})
    with pytest.raises(EnvError) as err:
        differ.check_identical()
    said = str(err.value)
    assert "env create proj: the environments differ between nodes" in said
    assert "tabulate" in said and "node1" in said and "0.9.0" in said, said
    assert "the same file and the same wheelhouse (put it on the share)" in said
