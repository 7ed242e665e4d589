"""This machine as a node, without SSH: commands run under bash with HOME set to a
directory of the test's own, and the node package is installed there by its real
installer (cluster/nodelib.py), as on a node."""

from __future__ import annotations

import os
import random
import socket
import subprocess
from pathlib import Path

from orchestrator.cluster import nodelib
from orchestrator.cluster.ssh import Result, SshTarget


class LocalNode:
    """ssh.Connection's run and popen, for a node whose home is HOME on this machine."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {**os.environ, "HOME": str(home)}
        self.runs: list[str] = []   # every command run, in order
        self.target = SshTarget("localnode")

    def shell(self) -> list[str]:
        """A remote shell for rsync's --rsh, as Connection.shell: it drops the host rsync
        names and runs the command in HOME."""
        return ["env", f"HOME={self.home}", "sh", "-c", 'cd "$HOME" && shift && exec "$@"',
                "rsh"]

    def run(self, command: str, timeout: float = 60.0, stdin: str | None = None) -> Result:
        self.runs.append(command)
        p = subprocess.run(["bash", "-c", command], input=stdin or "", env=self.env,
                           capture_output=True, text=True, timeout=timeout)
        return Result(p.returncode, p.stdout, p.stderr)

    def popen(self, command: str, stdin: bool = False) -> subprocess.Popen:
        self.runs.append(command)
        return subprocess.Popen(["bash", "-c", command], env=self.env,
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)


class Canned:
    """A node that answers every command with RESULTS in turn (the last one again once they
    run out), running nothing: a node whose answer is broken, as the test builds it."""

    def __init__(self, *results: Result) -> None:
        self.results = list(results)
        self.runs: list[str] = []   # every command run, in order

    def run(self, command: str, timeout: float = 60.0, stdin: str | None = None) -> Result:
        self.runs.append(command)
        return self.results.pop(0) if len(self.results) > 1 else self.results[0]

    def close(self) -> None:
        pass


def installed(home: Path) -> Path:
    """node.py of this version, installed under HOME as on a node."""
    nodelib.install(LocalNode(home))
    entry = Path(nodelib.entry(str(home)))
    assert entry.is_file(), entry
    return entry


def unused_port() -> int:
    """A TCP port nothing on this machine uses now, below the kernel's ephemeral range
    (32768 and up): a port from bind(0), once closed, can be taken at once by another
    test's outgoing connection when the tests run in parallel (pytest -n)."""
    for _ in range(500):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no unused port between 20000 and 32000")
