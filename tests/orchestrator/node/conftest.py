"""What the node package's tests share."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from orchestrator.node import cordon


@pytest.fixture
def open_share() -> Iterator[str]:
    """A share every user reaches, its cordon records' directory open to all as on the
    cluster (pytest's tmp_path is root's alone)."""
    root = tempfile.mkdtemp(prefix="cordon-share-")
    os.chmod(root, 0o755)
    os.mkdir(os.path.join(root, cordon.CORDONS_SUBDIR))
    os.chmod(os.path.join(root, cordon.CORDONS_SUBDIR), 0o1777)
    try:
        yield root
    finally:
        shutil.rmtree(root)
