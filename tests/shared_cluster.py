"""The sandbox tests' shared cluster: one 3-node sandbox that plays a real site, provisioned
by the real site.yml (the wheelhouse and a generated dataset on its share), reached only
through a bastion as the non-root user alice; one outsider on its network; Slurm with two
fake GPUs per node (a test double). The `sandbox_cluster` fixture (tests/conftest.py) makes
one, or uses the one CLUSTERTRAIN_TEST_SANDBOX names; `make test` makes it with this module
beside lint and the unit tests (provisioning takes minutes, mostly of one core), and for
daily work a developer makes one and keeps it:

    python -m tests.shared_cluster up NAME      # prints the sandbox's JSON (sandbox status)
    CLUSTERTRAIN_TEST_SANDBOX=NAME make sandbox-tests
    python -m tests.shared_cluster down NAME
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .cluster import BIN, REPO, orchestrator, run

WHEELHOUSE = REPO / ".cache" / "wheelhouse"   # built once per checkout, linked into shares


class ProvisionFailed(Exception):
    """A step of making the shared cluster failed; the message holds its output."""


def up(name: str, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Make and provision the sandbox NAME; its `sandbox up --json` description. On failure
    the sandbox is removed again and ProvisionFailed says which step and why."""
    started = time.monotonic()
    made = orchestrator("sandbox", "up", "--nodes", "3", "--outsiders", "1", "--bastion",
                        "--slurm", "--name", name, "--json")
    if made.returncode != 0:
        raise ProvisionFailed(f"sandbox up: {made.stdout[-3000:]}{made.stderr[-3000:]}")
    say(f"{name}: sandbox up took {time.monotonic() - started:.0f} s")
    started = time.monotonic()
    try:
        info: dict[str, Any] = json.loads(made.stdout)
        share = Path(info["share"])
        wh = orchestrator("wheelhouse", "--env", "environment.yml", "--dest", str(WHEELHOUSE))
        if wh.returncode != 0:
            raise ProvisionFailed(f"wheelhouse: {wh.stdout[-3000:]}{wh.stderr[-3000:]}")
        run("cp", "-al", str(WHEELHOUSE), str(share / "wheelhouse"), check=True)
        data = orchestrator("data", "synthetic", "--dest", str(share / "data" / "cifar10"))
        if data.returncode != 0:
            raise ProvisionFailed(f"data synthetic: {data.stderr[-3000:]}")
        say(f"{name}: the wheelhouse and the dataset took {time.monotonic() - started:.0f} s")
        started = time.monotonic()
        site = run(str(BIN / "ansible-playbook"), "-i", info["inventory"], "site.yml")
        if site.returncode != 0:
            raise ProvisionFailed(f"site.yml: {site.stdout[-6000:]}{site.stderr[-2000:]}")
        say(f"{name}: site.yml took {time.monotonic() - started:.0f} s")
        return info
    except BaseException:
        down(name)
        raise


def down(name: str) -> None:
    orchestrator("sandbox", "down", "--name", name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.shared_cluster",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("verb", choices=("up", "down"))
    parser.add_argument("name")
    args = parser.parse_args(argv)
    if args.verb == "down":
        down(args.name)
        return 0
    try:
        info = up(args.name, say=lambda line: print(line, file=sys.stderr))
    except ProvisionFailed as exc:
        print(f"the shared cluster {args.name} could not be made: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
