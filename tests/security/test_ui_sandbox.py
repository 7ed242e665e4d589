"""bob against alice's `ui` and her runs directory, on a node they both log in to (a
shared login node): alice's `ui` listens on that node's loopback over her runs directory,
whose run's run.json holds an --env value she meant as a secret. bob asks it on
127.0.0.1 without its token, and reads her runs directory straight from the disk. He
gets a refusal and nothing of the record either way; alice, with the URL `ui` printed
to her, gets it all."""

from __future__ import annotations

import json
import secrets
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import argcomplete
import pytest

from ..cluster import ENV as PODMAN_ENV, NODE_PYTHON, REPO, ProvisionedCluster
from .conftest import as_user

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(240)]
NODE = "node0"
RUN_ID = "20260921-101500-a1b2c3"
ENV_SECRET = "hf_9e8d7c6b5a-alices-secret"

# alice's run, recorded by the project's own RunDir under her umask 022; its node's log
# appended to as the follower does (open(..., "a")).
RECORD = f"""
import sys
from pathlib import Path
from orchestrator.record.rundir import RunDir
from orchestrator.record.summary import Summary
from orchestrator.run.conclude import write_summary
run = RunDir(Path(sys.argv[1]), {RUN_ID!r})
info = {{"run_id": run.run_id, "inventory": "/home/alice/inventory.yml", "nodes": ["node0"],
        "users": {{"node0": "alice"}}, "script": "train.py", "script_args": ["--epochs", "3"],
        "spec": {{"script": "train.py", "env": {{"HF_TOKEN": {ENV_SECRET!r}}}}}}}
run.create(info)
with open(run.log("node0"), "a", encoding="utf-8") as log:
    log.write("node0/rank0 | epoch 1 step 0 loss 0.5\\n")
write_summary(run, Summary.from_json({{**info, "status": "succeeded", "duration_s": 12.0}}))
"""

# `python -m orchestrator ui ARGS`: its verb alone (the whole CLI also loads the sandbox's
# verbs, whose cryptography the node's environment has not).
UI = ("import argparse, sys\n"
      "from orchestrator.cli import cmd_ui\n"
      "parser = argparse.ArgumentParser(prog='clustertrain')\n"
      "cmd_ui.register(parser.add_subparsers())\n"
      "args = parser.parse_args()\n"
      "sys.exit(args.func(args))\n")

# A user's client on the node (bob's, alice's): each path asked of 127.0.0.1:PORT, one JSON
# line each.
ASK = """
import json, sys, urllib.error, urllib.request
for path in sys.argv[2:]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}{path}", timeout=30) as r:
            print(json.dumps([path, r.status, r.read().decode(errors="replace")]))
    except urllib.error.HTTPError as e:
        print(json.dumps([path, e.code, e.read().decode(errors="replace")]))
"""


@dataclass(frozen=True)
class AliceUi:
    """alice's `ui` on NODE: where her files are, its port, the URL it printed to her."""

    top: str       # a directory of hers that others may traverse (0755), holding runs/
    runs: str
    port: int
    url: str


def _copy_package(cluster: ProvisionedCluster, dest: str) -> None:
    """The orchestrator package into DEST on NODE (readable by every user), as in a
    checkout (with the roles it reads its defaults from), to run `ui` there with the
    node's cluster environment (it has jinja2); beside it the one dependency of the CLI
    that environment lacks (argcomplete, pure Python), from this controller's."""
    site = Path(argcomplete.__file__).parents[1]
    for where, names in ((REPO, ["orchestrator", "roles", "site.yml"]), (site, ["argcomplete"])):
        tar = subprocess.Popen(["tar", "-C", str(where), "-cf", "-", "--exclude=__pycache__",
                                *names], stdout=subprocess.PIPE)
        subprocess.run(["podman", "exec", "-i", cluster.containers[NODE], "tar", "-C", dest,
                        "--no-same-owner", "-xf", "-"], stdin=tar.stdout, env=PODMAN_ENV,
                       check=True, capture_output=True, timeout=60)
        assert tar.wait(timeout=60) == 0


def _printed_url(cluster: ProvisionedCluster, out: str, within: float = 30) -> str:
    """The URL line `ui` printed into alice's terminal (the file OUT)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = cluster.exec(NODE, "cat", out, check=False).stdout
        for line in text.splitlines():
            if line.startswith("clustertrain ui: "):
                return line.split(": ", 1)[1].strip()
        time.sleep(0.3)
    raise AssertionError(f"`ui` printed no URL within {within} s: {text!r}")


@pytest.fixture(scope="module")
def alice_ui(sandbox_cluster: ProvisionedCluster) -> Iterator[AliceUi]:
    cluster, tag = sandbox_cluster, secrets.token_hex(4)
    pkg, top = f"/tmp/ct-ui-pkg-{tag}", f"/tmp/ct-ui-{tag}"
    out, pid = f"/home/alice/ct-ui-{tag}.out", f"/home/alice/ct-ui-{tag}.pid"
    cluster.exec(NODE, "install", "-d", "-m", "755", pkg)
    try:
        _copy_package(cluster, pkg)
        setup = as_user(cluster, NODE, "alice", f"""set -e
            umask 022
            mkdir -m 755 {top}
            PYTHONPATH={pkg} {NODE_PYTHON} - {top}/runs <<'EOF'
{RECORD}
EOF
            cd {top}
            PYTHONPATH={pkg} PYTHONUNBUFFERED=1 setsid {NODE_PYTHON} -c {shlex.quote(UI)} \\
                ui --runs-dir {top}/runs --port 0 >{out} 2>&1 </dev/null &
            echo $! >{pid}""")
        assert setup.returncode == 0, setup.stdout + setup.stderr
        url = _printed_url(cluster, out)
        yield AliceUi(top, f"{top}/runs", int(url.split(":")[2].split("/")[0]), url)
    finally:
        cluster.exec(NODE, "sh", "-c", f"test -s {pid} && kill $(cat {pid}); "
                     f"rm -rf {pkg} {top} {out} {pid}", check=False)


def _ask(cluster: ProvisionedCluster, user: str, port: int, *paths: str) -> dict:
    """{path: (status, body)} of USER's requests to 127.0.0.1:PORT on NODE."""
    got = as_user(cluster, NODE, user, f"{NODE_PYTHON} - {port} {' '.join(paths)} <<'EOF'"
                  f"\n{ASK}\nEOF")
    assert got.returncode == 0, got.stdout + got.stderr
    answers = [json.loads(line) for line in got.stdout.splitlines() if line.startswith("[")]
    return {path: (status, body) for path, status, body in answers}


def test_bob_gets_nothing_of_alices_ui_on_the_loopback_without_its_token(
        sandbox_cluster: ProvisionedCluster, alice_ui: AliceUi) -> None:
    paths = ("/", f"/runs/{RUN_ID}/", f"/runs/{RUN_ID}/run.json",
             f"/runs/{RUN_ID}/summary.json", f"/runs/{RUN_ID}/node0.log", "/nodes")
    for path, (status, body) in _ask(sandbox_cluster, "bob", alice_ui.port, *paths).items():
        assert status in (401, 403), (path, status, body[:500])
        for leak in (ENV_SECRET, RUN_ID, "train.py", "epoch 1"):
            assert leak not in body, (path, leak, body[:500])
        assert "open the URL `ui` printed" in body, body
    # alice, with the URL it printed to her, sees her run and its --env value.
    query = alice_ui.url.split("/", 3)[3]   # "?token=..."
    answers = _ask(sandbox_cluster, "alice", alice_ui.port, f"/runs/{RUN_ID}/run.json{query}")
    [(status, body)] = answers.values()
    assert status == 200 and ENV_SECRET in body, (status, body[:500])


def test_bob_cannot_read_alices_run_records_on_the_disk(
        sandbox_cluster: ProvisionedCluster, alice_ui: AliceUi) -> None:
    run = f"{alice_ui.runs}/{RUN_ID}"
    got = as_user(sandbox_cluster, NODE, "bob", f"""
        ls {alice_ui.runs}/
        for f in run.json summary.json node0.log report.html; do
            cat {run}/$f && echo "READ $f"
        done
        ls {run}/ && echo "LISTED"
        stat -c '%a %U %n' {run} {run}/* 2>&1""")
    seen = got.stdout + got.stderr
    assert RUN_ID in got.stdout, seen   # the runs directory lists: no more than that
    assert "READ " not in got.stdout and "LISTED" not in got.stdout, seen
    assert ENV_SECRET not in seen and "Permission denied" in got.stderr, seen
    modes = sandbox_cluster.exec(NODE, "sh", "-c", f"stat -c '%a %U %n' {run} {run}/*").stdout
    mode_of = {line.split()[2].rsplit("/", 1)[-1]: line.split()[:2]
               for line in modes.splitlines()}
    assert mode_of[RUN_ID] == ["700", "alice"], modes
    for name in ("run.json", "summary.json", "report.html"):
        assert mode_of[name] == ["600", "alice"], modes
