"""What a job wrote into its working directory reaches the next run from the same work
directory (node/carry.py), run for real on this machine's filesystem; the tutorial's
resume on three sandbox nodes is in run/test_carry_sandbox.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.node.carry import MANIFEST, carry
from orchestrator.node.supervise import prune


def snapshot(root: Path, run: str, files: dict[str, str]) -> Path:
    snap = root / "code" / run
    for name, text in files.items():
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).write_text(text)
    return snap


def test_the_next_run_finds_what_the_last_one_wrote(tmp_path: Path) -> None:
    code = tmp_path / "code"
    first = snapshot(tmp_path, "r1", {"train.py": "v1", "pkg/util.py": "u"})
    done = carry(str(code), "r1", "w")
    assert done["from"] is None and (first / MANIFEST).read_text() == "pkg/util.py\ntrain.py"
    (first / "snapshot.pt").write_text("epoch 2")                  # the job wrote these
    (first / "out" / "log.txt").parent.mkdir()
    (first / "out" / "log.txt").write_text("x")
    (first / "__pycache__").mkdir()
    (first / "__pycache__" / "train.pyc").write_text("bytecode")   # never carried
    second = snapshot(tmp_path, "r2", {"train.py": "v2", "pkg/util.py": "u"})
    done = carry(str(code), "r2", "w")
    assert done == {"from": "r1", "carried": ["out/log.txt", "snapshot.pt"], "kept_code": [],
                    "copied": False}
    assert (second / "snapshot.pt").read_text() == "epoch 2"
    assert (second / "snapshot.pt").stat().st_ino == (first / "snapshot.pt").stat().st_ino
    assert not (second / "__pycache__").exists()
    # carried again next time, with what r2 wrote; r1's files stay where they were
    (second / "snapshot.pt").unlink()
    (second / "snapshot.pt").write_text("epoch 4")
    third = snapshot(tmp_path, "r3", {"train.py": "v2", "pkg/util.py": "u"})
    assert carry(str(code), "r3", "w")["carried"] == ["out/log.txt", "snapshot.pt"]
    assert (third / "snapshot.pt").read_text() == "epoch 4"
    assert (first / "snapshot.pt").read_text() == "epoch 2"


def test_another_work_directory_carries_nothing(tmp_path: Path) -> None:
    code = tmp_path / "code"
    first = snapshot(tmp_path, "r1", {"train.py": "a"})
    carry(str(code), "r1", "one")
    (first / "snapshot.pt").write_text("a's")
    snapshot(tmp_path, "r2", {"train.py": "b"})
    assert carry(str(code), "r2", "other") == {"from": None, "carried": [],
                                                "kept_code": [], "copied": False}


def test_a_file_the_code_now_has_keeps_the_codes_version(tmp_path: Path) -> None:
    code = tmp_path / "code"
    first = snapshot(tmp_path, "r1", {"train.py": "a"})
    carry(str(code), "r1", "w")
    (first / "config.yaml").write_text("written by the job")
    second = snapshot(tmp_path, "r2", {"train.py": "a", "config.yaml": "in the code now"})
    done = carry(str(code), "r2", "w")
    assert done["kept_code"] == ["config.yaml"] and done["carried"] == []
    assert (second / "config.yaml").read_text() == "in the code now"


def test_a_run_still_running_gives_copies_not_its_own_files(tmp_path: Path) -> None:
    code = tmp_path / "code"
    first = snapshot(tmp_path, "r1", {"train.py": "a"})
    carry(str(code), "r1", "w")
    (first / "snapshot.pt").write_text("r1 writes here")
    job = tmp_path / "jobs" / "r1"
    job.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (job / "pgid").write_text(f"{sleeper.pid}\n")
        second = snapshot(tmp_path, "r2", {"train.py": "a"})
        done = carry(str(code), "r2", "w")
    finally:
        sleeper.kill()
    assert done["copied"] is True and done["carried"] == ["snapshot.pt"]
    assert (second / "snapshot.pt").stat().st_ino != (first / "snapshot.pt").stat().st_ino


def test_the_last_run_of_a_work_directory_is_never_pruned(tmp_path: Path) -> None:
    code = tmp_path / "code"
    for i in range(1, 5):
        snapshot(tmp_path, f"r{i}", {"train.py": "a"})
        carry(str(code), f"r{i}", "w" if i == 1 else "other")
    removed = prune(str(tmp_path), keep=1, current="r4")
    assert sorted(removed) == ["r2", "r3"] and (code / "r1").is_dir()
    assert sorted(os.listdir(code)) == [".work", "r1", "r4"]


def test_the_verb_answers_in_json(tmp_path: Path) -> None:
    snapshot(tmp_path, "r1", {"train.py": "a"})
    out = subprocess.run([sys.executable, "-m", "orchestrator.node", "carry",
                          str(tmp_path / "code"), "r1", "w"], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout)["carried"] == []
