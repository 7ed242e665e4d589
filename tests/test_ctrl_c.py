"""The test session itself: the commands the tests start can be interrupted with Ctrl-C,
however `make test` was started (tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys


def test_a_command_a_test_starts_does_not_ignore_ctrl_c() -> None:
    """Started from a script in the background, `make test` ignored SIGINT, and so did
    every train the tests pressed Ctrl-C on: four sandbox tests timed out waiting for
    them to stop (the queue's, the sweep's and the web view's Ctrl-C tests)."""
    seen = subprocess.run(
        [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"],
        capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert seen == "<built-in function default_int_handler>", seen
