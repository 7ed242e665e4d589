"""Job files on the real-site sandbox: a run from a file, and what `--dry-run` prints
(after the real preflight of the nodes) read back to the same spec."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ...cluster import ENV as PODMAN_ENV, REPO, ProvisionedCluster as Sandbox

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1500)]
JOBS = Path(__file__).resolve().parents[1] / "jobs"


def train(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", "train", *args], cwd=cwd,
                          env=PODMAN_ENV, capture_output=True, text=True, timeout=600)


def spec_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_a_run_from_a_job_file_and_its_dry_run_read_back(sandbox_cluster: Sandbox,
                                                          tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "inventory": str(sandbox_cluster.inventory), "nodes": 2, "workdir": str(JOBS),
        "script": "ddp_allreduce.py", "args": ["--steps", "2"], "env": {"LR": "0.5"},
        "runs_dir": "runs", "hang_timeout": 300}))
    done = train("-f", str(job))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    (run,) = list((tmp_path / "runs").iterdir())   # runs_dir: relative to the job file
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["script_args"] == ["--steps", "2"]
    record = json.loads((run / "run.json").read_text())["spec"]
    assert record["env"] == {"LR": "0.5"} and record["hang_timeout"] == 300

    first = train("-f", str(job), "--dry-run")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "# node0 (alice@node0), node rank 0" in first.stdout
    again = tmp_path / "again.yaml"
    again.write_text(first.stdout)
    second = train("-f", str(again), "--dry-run", cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert spec_lines(second.stdout) == spec_lines(first.stdout)
    assert yaml.safe_load(second.stdout) == yaml.safe_load(first.stdout) == record
    assert len(list((tmp_path / "runs").iterdir())) == 1   # a dry run records nothing
