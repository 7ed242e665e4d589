"""The sandbox tests' shared cluster: one 3-node sandbox that plays a real site, provisioned
by the real site.yml (the wheelhouse and a generated dataset on its share), reached only
through a bastion as the non-root user alice; one outsider on its network; Slurm with two
fake GPUs per node (a test double). The `sandbox_cluster` fixture (tests/conftest.py) makes
one, or uses the one CLUSTERTRAIN_TEST_SANDBOX names; `make test` makes two with this
module beside the unit tests (provisioning takes minutes, mostly of one core) and runs the
sandbox tests in two lanes, each on a cluster of its own. For daily work a developer makes
one (or two) and keeps it:

    python -m tests.shared_cluster up NAME [NAME2]   # prints the sandboxes' JSON
    CLUSTERTRAIN_TEST_SANDBOX=NAME make sandbox-tests
    CLUSTERTRAIN_TEST_SANDBOX=NAME,NAME2 make sandbox-tests LANES=2
    python -m tests.shared_cluster down NAME [NAME2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .cluster import BIN, ENV, REPO, orchestrator, run

WHEELHOUSE = REPO / ".cache" / "wheelhouse"   # built once per checkout, linked into shares


class ProvisionFailed(Exception):
    """A step of making the shared cluster failed; the message holds its output."""


def up(names: list[str], say: Callable[[str], None] = print, nodes: int = 3,
       users: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Make and provision the sandboxes NAMES, one per lane of tests (make test runs two
    lanes, each on a cluster of its own); their `sandbox up --json` descriptions. What they
    share is made once (the wheelhouse); their site.yml runs go at once. On failure every
    one is removed again and ProvisionFailed says which step and why. NODES and USERS (the
    researchers beside alice and bob): the soak's bigger cluster (bench/soak/run.py)."""
    infos: list[dict[str, Any]] = []
    try:
        for name in names:   # one after another: the first may build the node image
            started = time.monotonic()
            made = orchestrator("sandbox", "up", "--nodes", str(nodes), "--outsiders", "1",
                                "--bastion", "--slurm", "--name", name, "--json",
                                *(("--users", ",".join(users)) if users else ()))
            if made.returncode != 0:
                raise ProvisionFailed(f"sandbox up {name}: {made.stdout[-3000:]}"
                                      f"{made.stderr[-3000:]}")
            infos.append(json.loads(made.stdout))
            say(f"{name}: sandbox up took {time.monotonic() - started:.0f} s")
        started = time.monotonic()
        wh = orchestrator("wheelhouse", "--env", "environment.yml", "--dest", str(WHEELHOUSE))
        if wh.returncode != 0:
            raise ProvisionFailed(f"wheelhouse: {wh.stdout[-3000:]}{wh.stderr[-3000:]}")
        for info in infos:
            share = Path(info["share"])
            run("cp", "-al", str(WHEELHOUSE), str(share / "wheelhouse"), check=True)
            data = orchestrator("data", "synthetic", "--dest", str(share / "data" / "cifar10"))
            if data.returncode != 0:
                raise ProvisionFailed(f"data synthetic: {data.stderr[-3000:]}")
        say(f"the wheelhouse and the datasets took {time.monotonic() - started:.0f} s")
        started = time.monotonic()
        sites = [(info["name"], subprocess.Popen(
            [str(BIN / "ansible-playbook"), "-i", info["inventory"], "site.yml"], cwd=REPO,
            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            for info in infos]
        failed = []
        for name, site in sites:
            out, _ = site.communicate(timeout=1800)
            if site.returncode != 0:
                failed.append(f"site.yml on {name}: {out[-6000:]}")
        if failed:
            raise ProvisionFailed("\n".join(failed))
        say(f"site.yml on {', '.join(names)} took {time.monotonic() - started:.0f} s")
        return infos
    except BaseException:
        for name in names:
            down(name)
        raise


def down(name: str) -> None:
    orchestrator("sandbox", "down", "--name", name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.shared_cluster",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("verb", choices=("up", "down"))
    parser.add_argument("names", nargs="+", metavar="name",
                        help="one cluster per lane of tests (CLUSTERTRAIN_TEST_SANDBOX "
                             "takes them comma-separated)")
    args = parser.parse_args(argv)
    if args.verb == "down":
        for name in args.names:
            down(name)
        return 0
    try:
        infos = up(args.names, say=lambda line: print(line, file=sys.stderr))
    except ProvisionFailed as exc:
        print(f"the shared clusters {', '.join(args.names)} could not be made: {exc}",
              file=sys.stderr)
        return 1
    print(json.dumps(infos))
    return 0


if __name__ == "__main__":
    sys.exit(main())
