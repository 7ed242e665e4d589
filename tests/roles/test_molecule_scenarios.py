"""Which molecule scenarios `make test` runs: every one but `default` and `slurm`, whose
checks run on the sandbox tests' shared cluster instead (tests/roles/test_site_sandbox.py):
it is provisioned by the whole site.yml with Slurm."""

from __future__ import annotations

import re

from .sources import REPO


def test_make_test_runs_every_scenario_but_default_and_slurm() -> None:
    makefile = (REPO / "Makefile").read_text()
    listed = re.search(r"^MOLECULE_SCENARIOS := (.*)$", makefile, re.MULTILINE)
    assert listed, "Makefile: MOLECULE_SCENARIOS"
    scenarios = {d.name for d in (REPO / "molecule").iterdir() if (d / "molecule.yml").is_file()}
    assert sorted(listed.group(1).split()) == sorted(scenarios - {"default", "slurm"})
    site_test = (REPO / "tests" / "roles" / "test_site_sandbox.py").read_text()
    assert "molecule/default/verify.yml" in site_test
    assert "molecule/slurm/verify.yml" in site_test
