"""Bad variables for the health role fail before anything is changed, with a message that
names the variable (the real role, on localhost in check mode: its checks alone run;
tests/roles/test_nfs_args.py has how)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_nfs_args import run_role

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("variables, said", [
    ({"health_interval": "5mins"}, "health_interval must be a systemd time span"),
    ({"health_interval": "every 5 min"}, "it is 'every 5 min'"),
    ({"health_share_timeout": 0}, "health_share_timeout and health_max_clock_offset numbers "
                                  "of seconds above 0 (0,"),
    ({"health_min_free_inodes": -1}, "at least 0 (2.0, -1)"),
])
def test_a_bad_variable_is_refused_naming_it(tmp_path: Path, variables: dict, said: str
                                             ) -> None:
    done = run_role(tmp_path, "health", variables)
    assert done.returncode != 0
    assert said in " ".join(done.stdout.split()), done.stdout[-3000:]
