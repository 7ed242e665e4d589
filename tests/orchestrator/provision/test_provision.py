"""`python -m orchestrator provision`: a bad inventory is refused before anything runs.
(A re-run on the provisioned sandbox changing nothing, task by task and host by host:
tests/packaging/test_installed_sandbox.py, with the wheel-installed tool.)"""

from __future__ import annotations

from ...cluster import orchestrator


def test_provision_refuses_a_missing_inventory(tmp_path) -> None:
    missing = tmp_path / "nope.yml"
    p = orchestrator("provision", "-i", str(missing))
    assert p.returncode != 0
    assert f"inventory {missing} does not exist" in p.stderr, p.stderr
    assert "TASK " not in p.stdout
