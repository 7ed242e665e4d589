"""Shell completion of `clustertrain` (argcomplete), asked as bash asks it: the
completion variables set, the installed console script run, its answer read back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CLUSTERTRAIN = Path(sys.executable).parent / "clustertrain"
IFS = "\013"


def complete(line: str, cwd: Path) -> list[str]:
    out = cwd / "completions.out"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_STDOUT_FILENAME": str(out), "_ARGCOMPLETE_IFS": IFS}
    done = subprocess.run([str(CLUSTERTRAIN)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [w.strip() for w in out.read_text().split(IFS) if w.strip()]


def test_a_verb_completes(tmp_path: Path) -> None:
    assert complete("clustertrain tr", tmp_path) == ["train"]


def test_a_run_id_completes_from_the_runs_directory(tmp_path: Path) -> None:
    for run in ("20261127-101010-aaaaaa", "20261127-111111-bbbbbb"):
        (tmp_path / "runs" / run).mkdir(parents=True)
        (tmp_path / "runs" / run / "run.json").write_text("{}")
    offered = complete("clustertrain logs ", tmp_path)
    assert {"20261127-101010-aaaaaa", "20261127-111111-bbbbbb"} <= set(offered), offered
    assert complete("clustertrain stop 20261127-11", tmp_path) == ["20261127-111111-bbbbbb"]
    assert complete("clustertrain notebook co", tmp_path) == ["connect"]
    assert complete("clustertrain notebook connect 20261127-10", tmp_path) == [
        "20261127-101010-aaaaaa"]
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "20261127-121212-cccccc").mkdir(parents=True)
    (elsewhere / "20261127-121212-cccccc" / "run.json").write_text("{}")
    assert complete(f"clustertrain attach --runs-dir {elsewhere} 2026", tmp_path) == [
        "20261127-121212-cccccc"]


def test_hosts_complete_from_the_inventory(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[train_nodes]\n" + "".join(
        f"{n} ansible_host=127.0.0.{i + 1}\n" for i, n in enumerate(("node0", "node1", "gpu7"))))
    assert complete(f"clustertrain train -i {inventory} --hosts no", tmp_path) == [
        "node0", "node1"]
    assert complete(f"clustertrain train -i {inventory} --hosts node0,", tmp_path) == [
        "node0,node1", "node0,gpu7"]
    assert complete(f"clustertrain notebook -i {inventory} --host g", tmp_path) == ["gpu7"]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_completion_script_is_printed_for_the_shell(shell: str, tmp_path: Path) -> None:
    done = subprocess.run([str(CLUSTERTRAIN), "completion", shell], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "clustertrain" in done.stdout and "_ARGCOMPLETE" in done.stdout
    if shell == "bash":   # the script loads in bash as it is
        loaded = subprocess.run(["bash", "-c", f"{done.stdout}\ncomplete -p clustertrain"],
                                capture_output=True, text=True, timeout=60)
        assert loaded.returncode == 0 and "clustertrain" in loaded.stdout, loaded.stderr
