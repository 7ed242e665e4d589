"""A user's own environments on a node (orchestrator/node/envs.py): directories laid out as
playbooks/user_env.yml lays them out, in a home of the test's, and real processes that run
from one of them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.node import envs
from orchestrator.node.protocol import ENVS_DIR, LAST_USED


def make_env(home: Path, name: str, key: str, packages: int = 2) -> Path:
    path = home / ENVS_DIR / f"{name}-{key}"
    (path / "venv" / "bin").mkdir(parents=True)
    (path / "env.json").write_text(json.dumps({"name": name, "key": key}))
    (path / "python_env.json").write_text(json.dumps(
        {"backend": "venv", "prefix": str(path / "venv"),
         "python": str(path / "venv" / "bin" / "python")}))
    (path / "fingerprint.json").write_text(json.dumps(
        {"sha256": "ab" * 32, "packages": {f"p{i}": "1" for i in range(packages)}}))
    (path / "venv" / "lib.bin").write_bytes(b"x" * 4096)
    return path


def point(home: Path, name: str, key: str) -> None:
    link = home / ENVS_DIR / name
    if link.is_symlink():
        link.unlink()
    link.symlink_to(f"{name}-{key}")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_no_environments_is_an_empty_list(home: Path) -> None:
    assert envs.list_envs()["envs"] == []


def test_each_state_is_listed_with_its_size_and_the_newest_marked(home: Path) -> None:
    make_env(home, "proj", "aaaaaaaaaaaa")
    make_env(home, "proj", "bbbbbbbbbbbb", packages=3)
    make_env(home, "other", "cccccccccccc")
    point(home, "proj", "bbbbbbbbbbbb")
    (home / ENVS_DIR / "proj-aaaaaaaaaaaa" / LAST_USED).touch()
    listed = {(e["name"], e["key"]): e for e in envs.list_envs()["envs"]}
    assert set(listed) == {("proj", "aaaaaaaaaaaa"), ("proj", "bbbbbbbbbbbb"),
                           ("other", "cccccccccccc")}
    assert listed[("proj", "bbbbbbbbbbbb")]["current"]
    assert not listed[("proj", "aaaaaaaaaaaa")]["current"]
    assert not listed[("other", "cccccccccccc")]["current"]   # no link names it
    assert listed[("proj", "bbbbbbbbbbbb")]["packages"] == 3
    assert all(e["size"] >= 4096 and e["in_use"] == [] for e in listed.values())
    assert listed[("proj", "aaaaaaaaaaaa")]["last_used"] > time.time() - 60
    assert listed[("proj", "bbbbbbbbbbbb")]["last_used"] is None
    assert [e["key"] for e in envs.list_envs("other")["envs"]] == ["cccccccccccc"]


def test_a_process_that_runs_from_an_environment_keeps_it(home: Path) -> None:
    """A program of the environment (its python, torchrun...) running: the environment is
    in use, and `rm` removes nothing until it has ended."""
    path = make_env(home, "proj", "aaaaaaaaaaaa")
    make_env(home, "proj", "bbbbbbbbbbbb")
    point(home, "proj", "bbbbbbbbbbbb")
    sleeper = path / "venv" / "bin" / "sleep"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", sleeper)
    proc = subprocess.Popen([str(sleeper), "60"])
    try:
        deadline = time.time() + 10
        while not envs.users_of(str(path / "venv")) and time.time() < deadline:
            time.sleep(0.05)
        assert envs.users_of(str(path / "venv")) == [proc.pid]
        refused = envs.remove("proj")
        assert refused["removed"] == []
        assert refused["in_use"] == {str(path): [proc.pid]}
        assert path.is_dir() and (home / ENVS_DIR / "proj-bbbbbbbbbbbb").is_dir()
    finally:
        proc.kill()
        proc.wait()
    done = envs.remove("proj", "aaaaaaaaaaaa")   # one state: the other and its name stay
    assert done == {"removed": [str(path)], "in_use": {}}
    assert not path.exists() and (home / ENVS_DIR / "proj").resolve().is_dir()
    done = envs.remove("proj")
    assert done["removed"] == [str(home / ENVS_DIR / "proj-bbbbbbbbbbbb")]
    assert not os.path.lexists(home / ENVS_DIR / "proj")   # the name went with it


def test_old_states_are_pruned_but_never_the_newest_one_or_one_in_use(home: Path) -> None:
    paths = []
    for i, key in enumerate(["aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc", "dddddddddddd"]):
        paths.append(make_env(home, "proj", key))
        os.utime(paths[-1] / "env.json", (1000 + i, 1000 + i))   # made one after another
    point(home, "proj", "aaaaaaaaaaaa")   # the oldest is the one NAME points at (rolled back)
    make_env(home, "other", "eeeeeeeeeeee")
    sleeper = paths[1] / "venv" / "bin" / "sleep"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", sleeper)
    proc = subprocess.Popen([str(sleeper), "60"])
    try:
        deadline = time.time() + 10
        while not envs.users_of(str(paths[1] / "venv")) and time.time() < deadline:
            time.sleep(0.05)
        done = envs.prune("proj", 1)   # keep the newest: d; a is named, b in use
        assert done["removed"] == [str(paths[2])]
    finally:
        proc.kill()
        proc.wait()
    assert [p.exists() for p in paths] == [True, True, False, True]
    assert (home / ENVS_DIR / "other-eeeeeeeeeeee").is_dir()   # another name: untouched
    assert envs.prune("proj", 1)["removed"] == [str(paths[1])]


def test_an_unfinished_create_is_listed_and_removed_but_never_pruned(home: Path) -> None:
    """A state without env.json (env create interrupted after making the venv): listed
    under its directory's name and key as not complete, removed by `rm`, left by `prune`
    (another env create may be making it); an unrelated directory is not listed."""
    done = make_env(home, "proj", "aaaaaaaaaaaa")
    point(home, "proj", "aaaaaaaaaaaa")
    half = home / ENVS_DIR / "my.proj-0123456789ab"
    (half / "venv" / "bin").mkdir(parents=True)
    (home / ENVS_DIR / "notes").mkdir()
    listed = {e["key"]: e for e in envs.list_envs()["envs"]}
    assert set(listed) == {"aaaaaaaaaaaa", "0123456789ab"}
    assert listed["0123456789ab"]["name"] == "my.proj"
    assert not listed["0123456789ab"]["complete"] and listed["aaaaaaaaaaaa"]["complete"]
    half_of_proj = home / ENVS_DIR / "proj-0123456789ab"
    half.rename(half_of_proj)
    assert envs.prune("proj", 1)["removed"] == []
    assert envs.remove("proj", "0123456789ab")["removed"] == [str(half_of_proj)]
    assert done.is_dir() and not half_of_proj.exists()
