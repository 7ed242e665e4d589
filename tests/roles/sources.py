"""The Python files the roles and the collection ship (filters, modules, module_utils,
scripts copied to nodes), loaded by path as Ansible loads them: none is an importable
package of this repository."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load(relpath: str, name: str) -> ModuleType:
    """The file REPO/RELPATH as a module called NAME."""
    spec = importlib.util.spec_from_file_location(name, REPO / relpath)
    assert spec is not None and spec.loader is not None, relpath
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
