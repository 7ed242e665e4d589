"""The python_env role's reading of conda dependencies (plugins/filter/python_env_filters.py),
which `env create` uses too: what a venv cannot install, and which python a file asks for.
Pure unit tests."""

from __future__ import annotations

import pytest

from orchestrator.resources import project

from .sources import load

filters = load("plugins/filter/python_env_filters.py", "python_env_filters")


def test_a_venv_honours_python_and_pip_only() -> None:
    deps = ["python=3.11", "pip", "pip>=24", "python 3.11", "numpy=2.1", "cudatoolkit",
            "pytorch::pytorch", "pipx", "python-dateutil"]
    assert filters.venv_unsupported(deps) == ["numpy=2.1", "cudatoolkit", "pytorch::pytorch",
                                              "pipx", "python-dateutil"]
    assert filters.venv_unsupported(None) == []


@pytest.mark.parametrize(("dep", "version"), [
    ("python=3.11", "3.11"), ("python==3.11.4", "3.11.4"), ("python 3.12", "3.12"),
    ("python=3.11.*", "3.11"), (" python = 3.10 ", "3.10"), ("python", ""),
    ("python>=3.9", ""), ("pip", "")])
def test_the_python_a_file_asks_for(dep: str, version: str) -> None:
    assert filters.wanted_python(["pip", dep]) == version


def test_the_orchestrator_reads_the_same_file() -> None:
    """env create's refusal on the controller is the role's rule, not a copy of it."""
    shipped = project().plugin("filter", "python_env_filters")
    assert shipped.venv_unsupported(["numpy", "python=3.11"]) == ["numpy"]
    assert shipped.__file__ is not None and shipped.__file__.endswith(
        "plugins/filter/python_env_filters.py")
