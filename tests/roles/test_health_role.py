"""roles/health and the check it installs agree: the paths the role writes are the ones
files/health.py reads (and the node package's probe reads its state from), and every
setting the role writes is one the check knows."""

from __future__ import annotations

import re

import yaml

from orchestrator.node import health

from .sources import REPO

ROLE = REPO / "roles" / "health"


def test_the_roles_paths_are_the_checks() -> None:
    fixed = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    assert fixed["health_config"] == health.CONFIG
    assert fixed["health_state_dir"] == health.STATE_DIR
    assert fixed["health_unit"] == health.UNIT
    assert fixed["health_lib_dir"] == health.LIB_DIR
    # roles/nvidia_driver asks this check to hold a reboot until the node is idle
    driver = yaml.safe_load((REPO / "roles" / "nvidia_driver" / "vars" / "main.yml").read_text())
    assert driver["nvidia_driver_health_check"] == f"{health.LIB_DIR}/health.py"
    assert driver["nvidia_driver_health_unit"] == health.UNIT


def test_every_setting_the_role_writes_is_one_the_check_reads() -> None:
    tasks = (ROLE / "tasks" / "main.yml").read_text()
    written = set(re.findall(r"'(\w+)': ", tasks))
    assert written and written <= set(health.Config.__dataclass_fields__), \
        written - set(health.Config.__dataclass_fields__)


def test_its_defaults_are_the_checks() -> None:
    """The role's numbers and the check's own defaults (a config that lacks one) agree."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert float(defaults["health_share_timeout"]) == health.Config.share_timeout
    assert defaults["health_min_free_inodes"] == health.Config.min_free_inodes
    assert float(defaults["health_max_clock_offset"]) == health.Config.max_clock_offset
