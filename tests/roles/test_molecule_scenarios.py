"""Which molecule scenarios `make test` runs: every scenario's checks run once, either as a
molecule scenario of its own or (its converge being site.yml's playbooks) as its verify.yml
on the sandbox tests' shared cluster, provisioned by the whole site.yml with Slurm
(tests/roles/test_site_sandbox.py). A new scenario must be listed in one place or the other."""

from __future__ import annotations

import re

from .sources import REPO

ON_THE_SHARED_CLUSTER = {"default", "slurm", "python_env"}


def test_make_test_runs_every_scenarios_checks_once() -> None:
    makefile = (REPO / "Makefile").read_text()
    listed = re.search(r"^MOLECULE_SCENARIOS := (.*)$", makefile, re.MULTILINE)
    assert listed, "Makefile: MOLECULE_SCENARIOS"
    scenarios = {d.name for d in (REPO / "molecule").iterdir() if (d / "molecule.yml").is_file()}
    assert sorted(listed.group(1).split()) == sorted(scenarios - ON_THE_SHARED_CLUSTER)
    site_test = (REPO / "tests" / "roles" / "test_site_sandbox.py").read_text()
    assert "molecule/default/verify.yml" in site_test
    assert "molecule/slurm/verify.yml" in site_test
    assert "molecule/python_env/verify.yml" in site_test
    for name in ON_THE_SHARED_CLUSTER - {"default", "slurm"}:   # converged by site.yml
        converge = (REPO / "molecule" / name / "converge.yml").read_text()
        assert re.search(r"import_playbook: \.\./\.\./playbooks/\w+\.yml", converge)
