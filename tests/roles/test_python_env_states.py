"""The cluster environment's states on a node (module python_env_states): the usual path
made a link to the current state, old states removed only when no process runs from them,
the layout from before states replaced only when unused. Real directories and real
processes (a copy of sleep run from inside a state, as a venv's python runs from it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from .sources import REPO, load

states = load("plugins/modules/python_env_states.py", "python_env_states")


def state(root: Path, key: str, made: float) -> Path:
    path = root / key / "venv" / "bin"
    path.mkdir(parents=True)
    mark = root / key / states.MADE_MARK
    mark.write_text("name: clustertrain\n")
    os.utime(mark, (made, made))
    return root / key


def running_from(path: Path):
    """A process whose command line starts inside PATH, as torchrun's python does."""
    exe = path / "venv" / "bin" / "python"
    shutil.copy("/bin/sleep", exe)
    proc = subprocess.Popen([str(exe), "60"])
    deadline = time.monotonic() + 10
    while not states.users_of(str(path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def test_the_usual_path_names_the_current_state_and_a_second_time_changes_nothing(
        tmp_path: Path) -> None:
    root = tmp_path / "envs"
    old, new = state(root, "a" * 12, 1000), state(root, "b" * 12, 2000)
    link = tmp_path / "venv"
    assert states.point(str(link), str(old / "venv"), check=False) == (True, [])
    assert states.point(str(link), str(new / "venv"), check=True) == (True, [])
    assert os.readlink(link) == "envs/aaaaaaaaaaaa/venv"      # check mode changed nothing
    assert states.point(str(link), str(new / "venv"), check=False) == (True, [])
    assert os.readlink(link) == "envs/bbbbbbbbbbbb/venv" and link.resolve() == new / "venv"
    assert states.point(str(link), str(new / "venv"), check=False) == (False, [])


def test_old_states_beyond_keep_go_unless_a_process_runs_from_them(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    keys = ["a" * 12, "b" * 12, "c" * 12, "d" * 12]
    for n, key in enumerate(keys):
        state(root, key, 1000 + n)
    busy = running_from(root / keys[0])
    try:
        remove, in_use = states.plan_prune(str(root), keys[3], keep=2)
    finally:
        busy.kill()
        busy.wait()
    # kept: the current (d) and the newest other (c); a is in use, so only b goes
    assert remove == [str(root / keys[1])]
    assert in_use == {str(root / keys[0]): [busy.pid]}
    assert states.plan_prune(str(root), keys[3], keep=2)[0] == [str(root / k)
                                                                 for k in (keys[1], keys[0])]
    # the current state is kept even when older than the others
    assert str(root / keys[0]) not in states.plan_prune(str(root), keys[0], keep=1)[0]


def test_the_environment_from_before_states_is_replaced_only_when_unused(
        tmp_path: Path) -> None:
    root = tmp_path / "envs"
    new = state(root, "b" * 12, 2000)
    before = tmp_path / "venv"          # a real venv, as the role made it before states
    (before / "bin").mkdir(parents=True)
    busy = running_from(tmp_path)       # tmp_path/venv/bin/python
    try:
        assert states.point(str(before), str(new / "venv"), check=False) == (False, [busy.pid])
        assert before.is_dir() and not before.is_symlink()
    finally:
        busy.kill()
        busy.wait()
    assert states.point(str(before), str(new / "venv"), check=False) == (True, [])
    assert before.is_symlink() and before.resolve() == new / "venv"


@pytest.mark.parametrize("keep", [0, -1])
def test_keeping_no_state_is_refused(tmp_path: Path, keep: int) -> None:
    """The module's own check (run through Ansible by the role): keep 0 would remove the
    state every new run is about to use."""
    import json
    import sys

    state(tmp_path, "a" * 12, 1000)
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        "root": str(tmp_path), "current": "a" * 12, "keep": keep}}))
    module = REPO / "plugins" / "modules" / "python_env_states.py"
    out = subprocess.run([sys.executable, str(module), str(args)],
                         capture_output=True, text=True, timeout=60)
    result = json.loads(out.stdout)
    assert result["failed"] and "keep at least the current state" in result["msg"], result
    assert (tmp_path / ("a" * 12)).is_dir()
