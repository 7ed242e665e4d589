"""A user's own environment on the real-site sandbox: bob (no sudo) makes one from his own
wheelhouse on every node with `env create`, runs in it with `train --python-env` while alice
runs in the cluster's environment on the same nodes, runs a PyTorch Lightning and a Hugging
Face Trainer script in it (each launched twice: the second resumes from the first's
checkpoints on the share, as its framework does it; both get step times without printing
a beat), and preflight names a package he installed by hand. A wheelhouse the nodes cannot
read is refused first. One test: each step needs the one before (an environment takes a
minute to make on three nodes)."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ...cluster import ENV, REPO, ProvisionedCluster, orchestrator, run

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1500)]
NODES = ("node0", "node1", "node2")
JOB = """\
import sys, time
try:
    import tabulate
    have = tabulate.__version__
except ImportError:
    have = "absent"
import torch.distributed as dist
dist.init_process_group("gloo")
print("prefix", sys.prefix, "tabulate", have, flush=True)
time.sleep(8)   # the two users' runs overlap
dist.barrier()
dist.destroy_process_group()
"""


# What bob's environment has beyond the cluster's: a package of his own, and the two
# frameworks his scripts train with (with their dependencies, which pip resolves).
BOBS = ["tabulate==0.10.0", "lightning==2.6.6", "transformers==5.24.0", "accelerate==1.15.0"]


def env_file(path: Path) -> Path:
    """The project's environment.yml with more pip packages (BOBS: not in the cluster's
    environment), and without JupyterLab (a training environment needs none: making it on
    three nodes then takes a minute less), named bobenv."""
    text = (REPO / "environment.yml").read_text().replace("name: clustertrain",
                                                          "name: bobenv")
    text = "".join(line for line in text.splitlines(keepends=True)
                   if not line.strip().startswith("- jupyterlab=="))
    more = "".join(f"      - {p}\n" for p in BOBS)
    path.write_text(text.replace("      - pyyaml==", more + "      - pyyaml=="))
    return path


def frameworks(bob: Path, runs: Path, share: Path, name: str, prefix: str) -> None:
    """A Lightning and a Hugging Face Trainer script in bob's environment (PREFIX) on 3
    nodes, each launched twice: the second launch resumes from the first's checkpoints on
    the share. Neither prints a beat: the worker runner measures their DDP steps."""
    jobs = Path(__file__).parents[1] / "jobs"
    ckpt = f"/mnt/cluster/checkpoints/bob/{name}"
    launches = [("lightning", ["lightning_job.py", "--", "--nodes", "3", "--ckpt-dir",
                               f"{ckpt}/lightning", "--samples", "6144", "--epochs", e])
                for e in ("2", "3")]
    launches += [("hf", ["hf_trainer_job.py", "--", "--out", f"{ckpt}/hf", "--steps", s])
                 for s in ("30", "60")]
    said = {}
    for n, (what, args) in enumerate(launches):
        out = orchestrator("train", "-i", str(bob), "--nodes", "3", "--python-env", "bobenv",
                           "--workdir", str(jobs), "--runs-dir", str(runs / f"{n}-{what}"),
                           *args, timeout=600)
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
        assert "##clustertrain beat" not in out.stdout
        [record] = (runs / f"{n}-{what}").glob("*/summary.json")
        summary = json.loads(record.read_text())
        assert summary["env_prefix"] == prefix, summary["env_prefix"]
        times = summary.get("step_times") or {}
        assert sorted(times) == list(NODES) and all(
            t["step_s"] > 0 and "wait_s" in t and t["samples_per_s"] > 0
            for t in times.values()), (what, times, out.stdout[-3000:])
        assert (record.parent / "timeline.jsonl").read_text().count('"step_s"') >= 1
        said[(what, n % 2)] = out.stdout
    assert "epoch 0 starts" in said[("lightning", 0)] and "trained to epoch 2" in \
        said[("lightning", 0)]
    resumed = said[("lightning", 1)]
    assert "Restoring states from the checkpoint path at " \
        f"{ckpt}/lightning/last.ckpt" in resumed, resumed[-3000:]
    assert "epoch 2 starts" in resumed and "epoch 0 starts" not in resumed
    assert "trained to step 30" in said[("hf", 0)] and "resuming" not in said[("hf", 0)]
    assert "resuming from checkpoint-30" in said[("hf", 1)], said[("hf", 1)][-3000:]
    assert "trained to step 60" in said[("hf", 1)]
    assert share.joinpath("checkpoints", "bob", name, "hf", "checkpoint-60").is_dir()


def listed(inventory: Path) -> list[dict]:
    out = orchestrator("env", "list", "--json", "-i", str(inventory), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    states: list[dict] = json.loads(out.stdout)
    return states


def start(inventory: Path, runs: Path, work: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "train", "-i", str(inventory), "--nodes", "3",
         "--share-gpus", "--workdir", str(work), "--runs-dir", str(runs), *args, "job.py"],
        cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.extended
def test_bob_makes_his_own_environment_and_runs_in_it_beside_alice(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    bob = sandbox_cluster.inventories["bob"]
    # A name of this run's own on the share: a path used by an earlier session on the same
    # cluster, removed on the host, can linger in a node's view of the share (the sandbox's
    # FUSE union), which then refused bob's HF checkpoint there.
    ckpt_name = f"{tmp_path.name}-{secrets.token_hex(3)}"
    # Conda packages on a cluster without conda: refused before any node is touched.
    conda = tmp_path / "conda.yml"
    conda.write_text("name: c\ndependencies:\n  - python=3.11\n  - numpy\n  - pip\n")
    refused = orchestrator("env", "create", "-f", str(conda), "-i", str(bob))
    assert refused.returncode != 0 and "asks conda for numpy" in refused.stderr, \
        refused.stdout + refused.stderr
    assert sandbox_cluster.exec("node0", "sh", "-c", "ls -d /home/bob/.clustertrain/envs/c*",
                                check=False).returncode != 0   # no environment c, not begun

    # bob's wheelhouse, on the share, built from his file.
    spec = env_file(tmp_path / "bobenv.yml")
    wheelhouse = sandbox_cluster.share / "wheelhouse-bob"
    tools_wheels = sandbox_cluster.share / "wheelhouse-tools"
    shutil.rmtree(wheelhouse, ignore_errors=True)
    # A wheelhouse on this machine alone: the nodes cannot read it, refused before any
    # node is touched, naming them and where to put it.
    here = tmp_path / "wheelhouse-here"
    here.mkdir()
    refused = orchestrator("env", "create", "-f", str(spec), "--wheelhouse", str(here),
                           "-i", str(bob))
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert f"--wheelhouse {here}: node0, node1, node2 cannot read it (it is a directory " \
        "on this machine" in refused.stderr and "/mnt/cluster/wheelhouse-bobenv" in \
        refused.stderr, refused.stdout + refused.stderr
    assert sandbox_cluster.exec("node0", "sh", "-c", "ls -d /home/bob/.clustertrain/envs/bob*",
                                check=False).returncode != 0
    built = orchestrator("wheelhouse", "--env", str(spec), "--dest", str(wheelhouse))
    assert built.returncode == 0, built.stdout + built.stderr
    try:
        made = orchestrator("env", "create", "-f", str(spec), "--wheelhouse",
                            "/mnt/cluster/wheelhouse-bob", "-i", str(bob))
        assert made.returncode == 0, made.stdout + made.stderr
        assert "(made on 3, already there on 0)" in made.stdout, made.stdout
        [state] = listed(bob)
        assert state["name"] == "bobenv" and sorted(state["nodes"]) == list(NODES)
        assert len(state["fingerprints"]) == 1 and sorted(state["current"]) == list(NODES)
        # Installed without bytecode (three times faster); bob's first run that imports a
        # module writes it (below).
        cache = (f"/home/bob/.clustertrain/envs/bobenv-{state['key']}/venv/lib/python3*/"
                 "site-packages/tabulate/__pycache__")
        assert sandbox_cluster.exec("node0", "sh", "-c", f"ls -d {cache}",
                                    check=False).returncode != 0

        # At the same time on the same nodes: bob in his environment, alice in the cluster's.
        work = tmp_path / "work"
        work.mkdir()
        (work / "job.py").write_text(JOB)
        bob_run = start(bob, tmp_path / "bob-runs", work, "--python-env", "bobenv")
        alice_run = start(sandbox_cluster.inventory, tmp_path / "alice-runs", work)
        bob_out, _ = bob_run.communicate(timeout=600)
        alice_out, _ = alice_run.communicate(timeout=600)
        assert bob_run.returncode == 0, bob_out[-4000:]
        assert alice_run.returncode == 0, alice_out[-4000:]
        key = state["key"]
        mine = f"prefix /home/bob/.clustertrain/envs/bobenv-{key}/venv tabulate 0.10.0"
        for rank, node in enumerate(NODES):
            assert f"{node}/rank{rank} | {mine}" in bob_out, bob_out
        owner = sandbox_cluster.exec("node0", "sh", "-c", f"stat -c %U {cache}/*.pyc",
                                     check=False)
        assert owner.stdout.split() == ["bob"], owner.stdout + owner.stderr
        # alice's, in the cluster's environment: its current state (python_env.json).
        cluster = json.loads(sandbox_cluster.exec(
            "node0", "cat", "/etc/clustertrain/python_env.json").stdout)["prefix"]
        assert re.fullmatch(r"/opt/clustertrain/envs/[0-9a-f]{12}/venv", cluster), cluster
        for rank, node in enumerate(NODES):
            assert f"{node}/rank{rank} | prefix {cluster} tabulate absent" in alice_out, \
                alice_out
        [bob_record] = (tmp_path / "bob-runs").glob("*/summary.json")
        summary = json.loads(bob_record.read_text())
        assert summary["python_env"] == {
            "name": "bobenv", "dir": f"/home/bob/.clustertrain/envs/bobenv-{key}"}
        # The fingerprint of the run is that of bob's environment, with tabulate in it.
        assert summary["fingerprint"]["sha256"][:12] == state["fingerprints"][0]
        assert summary["fingerprint"]["packages"]["tabulate"] == "0.10.0"

        # His own scripts, written for Lightning and for the Hugging Face Trainer.
        frameworks(bob, tmp_path / "bob-frameworks", sandbox_cluster.share, ckpt_name,
                   f"/home/bob/.clustertrain/envs/bobenv-{key}/venv")

        # A pip install by hand into bob's environment on node1 (of a package the project's
        # environment lacks): refused by preflight.
        run(sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(wheelhouse),
            "colorama==0.4.6", check=True)
        pip = sandbox_cluster.exec(
            "node1", "runuser", "-u", "bob", "--", "/home/bob/.clustertrain/envs/bobenv/venv/"
            "bin/pip", "install", "--no-index", "--find-links", "/mnt/cluster/wheelhouse-bob",
            "colorama==0.4.6", check=False)
        assert pip.returncode == 0, pip.stdout + pip.stderr
        dry = orchestrator("train", "-i", str(bob), "--nodes", "3", "--python-env", "bobenv",
                           "--workdir", str(work), "--runs-dir", str(tmp_path / "bob-runs"),
                           "--dry-run", "job.py")
        assert dry.returncode != 0
        said = dry.stdout + dry.stderr
        assert "environment drift in bob's environment bobenv" in said, said
        assert "node1 since provisioning: package colorama: absent when provisioned, 0.4.6 now" \
            in said, said
        # The same file again: env create puts it back on node1 alone, and on node0 and
        # node2, where it is as it was made, nothing is made.
        fixed = orchestrator("env", "create", "-f", str(spec), "--wheelhouse",
                             "/mnt/cluster/wheelhouse-bob", "-i", str(bob))
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert "(made on 1, already there on 2)" in fixed.stdout, fixed.stdout + fixed.stderr
        gone = sandbox_cluster.exec("node1", "runuser", "-u", "bob", "--",
                                    "/home/bob/.clustertrain/envs/bobenv/venv/bin/python",
                                    "-c", "import colorama", check=False)
        assert gone.returncode != 0

        # One line changed: a new environment beside the old one. Shown on node0 with a small
        # file of its own (its own wheelhouse: a lock is built for one pip section), where
        # making an environment takes seconds, not a minute of torch.
        small = tmp_path / "tools.yml"
        small.write_text("name: tools\ndependencies:\n  - python=3.11\n  - pip\n  - pip:\n"
                         "      - tabulate==0.10.0\n")
        built = orchestrator("wheelhouse", "--env", str(small), "--dest", str(tools_wheels))
        assert built.returncode == 0, built.stdout + built.stderr
        keys = []
        for text in (small.read_text(), small.read_text() + "# one more line\n"):
            small.write_text(text)
            made = orchestrator("env", "create", "-f", str(small), "--wheelhouse",
                                "/mnt/cluster/wheelhouse-tools", "--hosts", "node0",
                                "-i", str(bob))
            assert "(made on 1, already there on 0)" in made.stdout, made.stdout + made.stderr
            keys.append(made.stdout.split("env create tools: tools-")[1][:12])
        states = {s["key"]: s for s in listed(bob) if s["name"] == "tools"}
        assert set(states) == set(keys) and len(keys) == 2, states
        assert states[keys[1]]["current"] == ["node0"]   # the newest is named
        assert states[keys[0]]["nodes"] == ["node0"]     # the old one is kept
        assert states[keys[0]]["current"] == []
    finally:
        for name in ("bobenv", "tools"):
            orchestrator("env", "rm", name, "-i", str(bob))
        shutil.rmtree(wheelhouse, ignore_errors=True)
        shutil.rmtree(tools_wheels, ignore_errors=True)
        shutil.rmtree(sandbox_cluster.share / "checkpoints" / "bob" / ckpt_name,
                      ignore_errors=True)
    assert listed(bob) == []


def test_an_environment_whose_packages_do_not_import_is_not_made_ready(
        sandbox_cluster: ProvisionedCluster, tmp_path: Path) -> None:
    """Two packages that install together but do not import together (vision-fake raises
    at its import, as a torchvision built for another torch does): env create fails naming
    the node, the package and the import's own last error line; the state is left
    unfinished (no env.json), and the name does not point at it."""
    from orchestrator.provision.wheelhouse import load_environment, write_lock
    from tests.roles.test_python_env_imports import MISMATCH, wheel
    bob = sandbox_cluster.inventories["bob"]
    wheelhouse = sandbox_cluster.share / "wheelhouse-broken"
    shutil.rmtree(wheelhouse, ignore_errors=True)
    wheelhouse.mkdir()
    files = [wheel(wheelhouse, "good-pkg", {"goodpkg/__init__.py": "VERSION = '1.0'\n"}).name,
             wheel(wheelhouse, "vision-fake", {"visionfake/__init__.py": (
                 "import goodpkg\nraise RuntimeError('operator torchvision::nms does not "
                 "exist')\n")}).name]
    spec = tmp_path / "broken.yml"
    spec.write_text("name: broken\ndependencies:\n  - python=3.11\n  - pip\n  - pip:\n"
                    "      - good-pkg==1.0\n      - vision-fake==1.0\n")
    write_lock(wheelhouse, files, load_environment(spec), spec)
    try:
        made = orchestrator("env", "create", "-f", str(spec), "--wheelhouse",
                            "/mnt/cluster/wheelhouse-broken", "--hosts", "node0", "-i",
                            str(bob))
        said = made.stdout + made.stderr
        assert made.returncode != 0, said
        assert "The environment's packages do not all import on node0, so it is not ready: " \
            f"vision-fake (import visionfake): {MISMATCH}." in made.stderr, said
        [state] = [s for s in listed(bob) if s["name"] == "broken"]
        assert state["incomplete"] == ["node0"] and state["current"] == [], state
    finally:
        orchestrator("env", "rm", "broken", "-i", str(bob))
        shutil.rmtree(wheelhouse, ignore_errors=True)
