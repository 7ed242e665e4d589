"""Fixtures for the training job's tests: a synthetic dataset and the job's modules.

The job in train/ is a directory of scripts (torchrun runs train/train.py), not a
package; its modules are imported here from that directory under their own names.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAIN_DIR = REPO / "train"
TRAIN_PY = TRAIN_DIR / "train.py"
# The orchestrator starts every worker through its runner (`node.py worker`, the node
# package's entry; in a checkout orchestrator/node/entry.py); so do these tests.
RUNNER = REPO / "orchestrator" / "node" / "entry.py"

# Small and quick on a 2-core machine shared with other work.
TINY = ["--width", "8", "--batch-size", "32", "--log-every", "1000"]


@pytest.fixture(scope="session")
def train_modules():
    """Import train/*.py (checkpoint, data, ...) the way train.py itself does."""
    if str(TRAIN_DIR) not in sys.path:
        sys.path.insert(0, str(TRAIN_DIR))
    return lambda name: importlib.import_module(name)


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory) -> Path:
    """1000 training and 200 test images, 10 classes, written by the data command's code."""
    from orchestrator.provision.data import SyntheticSpec, write_synthetic

    dest = tmp_path_factory.mktemp("synthetic")
    write_synthetic(dest, SyntheticSpec(train_per_class=100, test_per_class=20, seed=0),
                    log=lambda *_: None)
    return dest


def job_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONWARNINGS="ignore::UserWarning")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_cmd(nproc: int, *args: str, max_restarts: int = 0) -> list[str]:
    """torchrun on loopback only: one node, `nproc` processes, gloo, each worker started
    through the worker runner as the orchestrator starts it.

    The c10d rendezvous gives every restart round a fresh store; with the static
    one (--master-addr/--master-port) a restarted rank was seen to read the dead
    rank's stale gloo address and fail to connect.
    """
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", uuid.uuid4().hex[:12],
            "--max-restarts", str(max_restarts), str(RUNNER), "worker", str(TRAIN_PY), *args]
