"""The python_env role's reading of an environment file's conda dependencies: which of them
a venv can honour (python and pip) and which python the file asks for. The orchestrator's
`env create` loads this file too (orchestrator/provision/userenv.py), to refuse on the
controller what the role would refuse on every node.
Tests: tests/roles/test_python_env_filters.py."""

from __future__ import annotations

import re

# What a venv honours of the conda dependencies: python (its version is checked against the
# node's) and pip, with or without a version.
VENV_HONOURS = re.compile(r"^\s*(python|pip)\s*([=<>!~ ].*)?$")
# python=3.11, python==3.11.4, "python 3.11", python=3.11.*: the version asked for.
PYTHON_VERSION = re.compile(r"^\s*python\s*(?:==?|\s)\s*([0-9][0-9.]*?)(?:\.\*|\*)?\s*$")


def venv_unsupported(deps):
    """The conda dependencies (strings) that a venv cannot install."""
    return [str(d) for d in deps or [] if not VENV_HONOURS.match(str(d))]


def wanted_python(deps):
    """The python version the dependencies ask for ('3.11'), or '' when none."""
    for dep in deps or []:
        match = PYTHON_VERSION.match(str(dep))
        if match:
            return match.group(1)
    return ""


class FilterModule:
    def filters(self):
        return {"venv_unsupported": venv_unsupported, "wanted_python": wanted_python}
