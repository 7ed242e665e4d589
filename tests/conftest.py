"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import uuid

import pytest

from orchestrator.podman import CONTAINERS_CONF

os.environ.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))


@pytest.fixture
def sandbox_name():
    """A sandbox name unique to this test run; whatever it left behind is removed after the test."""
    from orchestrator.sandbox import cluster

    names: list[str] = []

    def make(prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        names.append(name)
        return name

    yield make
    for name in names:
        cluster.down(name, log=lambda *_: None)
