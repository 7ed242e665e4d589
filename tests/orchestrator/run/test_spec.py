"""A run's spec from the command line and job files (run/spec.py): one description, the
same checks for both, a job file refused by key and line before any node is touched, and
what --dry-run prints read back to the same spec. No sandbox: nothing here reaches a node
(the loopback inventory would say "cannot reach" if anything did)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.cli import parse
from orchestrator.cli.cmd_train import parse_request
from orchestrator.run.spec import KEYS, RunSpec, from_sources, read_job_file

from ...clirun import run_cli as run


@pytest.fixture
def place(tmp_path: Path) -> Path:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "job.py").write_text("print('hi')\n")
    (tmp_path / "hosts.ini").write_text("[train_nodes]\nnode0 ansible_host=127.0.0.1 "
                                        "ansible_port=1\nnode1 ansible_host=127.0.0.2 "
                                        "ansible_port=1\n")
    return tmp_path


def job(place: Path, text: str, name: str = "job.yaml") -> Path:
    path = place / name
    path.write_text(text)
    return path




FULL = """\
inventory: hosts.ini
nodes: 2
workdir: code
script: job.py
args: [--epochs, "3", --lr, "0.1"]
env: {LR: "0.5", NAME: my run}
nproc_per_node: 2
max_restarts: 1
rdzv_backend: c10d
torchrun_arg: [--monitor-interval=1]
runs_dir: records
grace: 2
detach: true
lease_timeout: 20
keep_runs: 5
hang_timeout: 300
on_hang: wait
share_gpus: true
"""


def test_a_job_file_is_read_into_the_spec_with_paths_relative_to_it(place) -> None:
    spec = from_sources(read_job_file(job(place, FULL)))
    assert spec.inventory == place / "hosts.ini" and spec.workdir == place / "code"
    assert spec.runs_dir == place / "records" and spec.script == "job.py"
    assert spec.script_args == ("--epochs", "3", "--lr", "0.1")
    assert spec.env == {"LR": "0.5", "NAME": "my run"} and spec.nproc_per_node == 2
    assert (spec.max_restarts, spec.rdzv_backend, spec.torchrun_args) == (
        1, "c10d", ("--monitor-interval=1",))
    assert (spec.grace, spec.detach, spec.lease_timeout, spec.keep_runs) == (2, True, 20, 5)
    assert (spec.hang_timeout, str(spec.on_hang)) == (300, "wait")
    assert spec.share_gpus is True


def test_the_command_line_overrides_the_file(place) -> None:
    path = job(place, FULL)
    spec = parse_request(parse(["train", "-f", str(path), "--nodes", "1", "--grace", "7",
                                "--env", "OTHER=1", "--", "--epochs", "9"]))
    assert spec.nodes == 1 and spec.grace == 7 and spec.env == {"OTHER": "1"}
    assert spec.script == "job.py" and spec.script_args == ("--epochs", "9")
    assert spec.keep_runs == 5   # not given here: the file's
    assert parse_request(parse(["train", "--share-gpus"])).share_gpus is True
    assert parse_request(parse(["train"])).share_gpus is False
    other = place / "code" / "other.py"
    other.write_text("")
    spec = parse_request(parse(["train", "-f", str(path), "other.py"]))
    assert spec.script == "other.py" and spec.script_args == ()  # a new script, its own args


def test_what_dry_run_prints_is_a_job_file_of_the_same_spec(place) -> None:
    spec = from_sources(read_job_file(job(place, FULL)))
    again = from_sources(read_job_file(job(place, spec.to_yaml(), "again.yaml")))
    assert again == spec
    assert yaml.safe_load(again.to_yaml()) == yaml.safe_load(spec.to_yaml())
    module = RunSpec(workdir=place / "code", script="pkg.train", module=True)
    back = from_sources(read_job_file(job(place, module.to_yaml(), "m.yaml")))
    assert (back.script, back.module) == ("pkg.train", True)


def test_every_key_of_a_job_file_is_an_option_of_train(capsys) -> None:
    code, out = run(["train", "--help"], capsys)
    options = set(out.replace(",", " ").split())
    for key in KEYS:
        if key in ("args", "script", "module"):
            continue
        assert f"--{key.replace('_', '-')}" in options, key


@pytest.mark.parametrize("text, words", [
    ("nodes: 2\nepochs: 3\n", "job.yaml line 2: unknown key 'epochs'"),
    ("nodse: 2\n", "job.yaml line 1: unknown key 'nodse' (did you mean 'nodes'?)"),
    ("workdir: code\nnodes: two\n", "job.yaml line 2: nodes must be a whole number, not 'two'"),
    ("detach: 1\n", "job.yaml line 1: detach must be true or false, not 1"),
    ("nodes: true\n", "job.yaml line 1: nodes must be a whole number, not True"),
    ("args: --epochs 3\n", "job.yaml line 1: args must be a list of the script's arguments"),
    ("- nodes\n", "is not a mapping of train's options"),
    ("nodes: [2\n", "is not valid YAML"),
])
def test_a_bad_job_file_is_refused_naming_the_key_and_line(place, capsys, text, words) -> None:
    path = job(place, text)
    code, out = run(["train", "-f", str(path), "--dry-run"], capsys)
    assert code != 0 and words in out, out
    assert "cannot reach" not in out and "Traceback" not in out


@pytest.mark.parametrize("text, words", [
    ("workdir: code\nscript: job.py\nnproc_per_node: many\n",
     "job.yaml line 3: nproc_per_node 'many': give 'auto' or a positive number"),
    ("workdir: code\nscript: job.py\non_hang: maybe\n",
     "job.yaml line 3: on_hang 'maybe': give stop or wait"),
    ("workdir: code\nscript: job.py\nenv: {RANK: '3'}\n",
     "job.yaml line 3: env: RANK is set by torchrun"),
    ("workdir: code\nscript: job.py\ntorchrun_arg: [--nnodes=3]\n",
     "torchrun's --nnodes is set by clustertrain"),
    ("workdir: code\nscript: nothere.py\n", "script 'nothere.py' not found in"),
    ("workdir: elsewhere\n", "job.yaml line 1: workdir"),
    ("workdir: code\nscript: job.py\nlease_timeout: 1\n",
     "job.yaml line 3: lease_timeout 1: give at least 3 seconds"),
    ("workdir: code\nscript: job.py\ngpus_per_node: 2\n",
     "job.yaml line 3: gpus_per_node goes with --queue"),
    ("workdir: code\nscript: job.py\nqueue: true\ntime: soon\n",
     "job.yaml line 4: time 'soon': give a Slurm time"),
    ("workdir: code\nscript: job.py\nqueue: true\npartition: 'a b'\n",
     "job.yaml line 4: partition 'a b': give a Slurm partition"),
    ("workdir: code\nscript: job.py\nqueue: true\n",
     "says cluster_scheduler: none, so the cluster runs no Slurm"),
    ("workdir: code\nscript: job.py\npython_env: ../x\n",
     "job.yaml line 3: python_env '../x': an environment's name is letters, digits"),
    ("workdir: code\nscript: job.py\nspares: 1\n",
     "job.yaml line 3: spares goes with --max-recoveries N"),
    ("workdir: code\nscript: job.py\nmax_recoveries: -1\n",
     "job.yaml line 3: max_recoveries -1: give 0 or more"),
    ("workdir: code\nscript: job.py\nmax_recoveries: 1\nspares: 1\nspare_hosts: [node1]\n",
     "job.yaml line 5: spare_hosts: give one of them"),
    ("workdir: code\nscript: job.py\nmax_recoveries: 1\nqueue: true\n",
     "job.yaml line 3: max_recoveries with --queue: a run through Slurm's queue does not "
     "recover yet"),
    ("workdir: code\nscript: job.py\nnodes: 1\nmax_recoveries: 1\nspare_hosts: [node0]\n",
     "--spare-hosts: node0 is one of the run's own nodes"),
    ("workdir: code\nscript: job.py\nnodes: 2\nmax_recoveries: 1\nspares: 1\n",
     "--spares 1: "),
])
def test_a_job_files_values_are_checked_as_the_options_are(place, capsys, text, words) -> None:
    code, out = run(["train", "-f", str(job(place, text)), "-i", str(place / "hosts.ini")],
                    capsys)
    assert code != 0 and words in out, out
    assert "cannot reach" not in out


def test_the_queue_options_reach_the_spec_and_its_job_file(place) -> None:
    spec = parse_request(parse(["train", "--queue", "--gpus-per-node", "1", "--partition",
                                "gpu", "--time", "1-00:00:00", "--qos", "high", "--workdir",
                                str(place / "code"), "job.py"]))
    assert (spec.queue, spec.gpus_per_node, spec.partition, spec.time, spec.qos) == (
        True, 1, "gpu", "1-00:00:00", "high")
    again = from_sources(read_job_file(job(place, spec.to_yaml())))
    assert (again.queue, again.gpus_per_node, again.partition, again.time, again.qos) == (
        True, 1, "gpu", "1-00:00:00", "high")


def test_a_users_own_environment_reaches_the_spec_and_its_job_file(place) -> None:
    spec = parse_request(parse(["train", "--python-env", "proj-2", "--workdir",
                                str(place / "code"), "job.py"]))
    assert spec.python_env == "proj-2"
    assert from_sources(read_job_file(job(place, spec.to_yaml()))).python_env == "proj-2"


def test_the_recovery_options_reach_the_spec_and_its_job_file(place) -> None:
    spec = parse_request(parse(["train", "--max-recoveries", "2", "--spare-hosts", "n2,n3",
                                "--min-nodes", "1", "--workdir", str(place / "code"),
                                "job.py"]))
    assert (spec.max_recoveries, spec.spares, spec.spare_hosts, spec.min_nodes) == (
        2, 0, ("n2", "n3"), 1)
    again = from_sources(read_job_file(job(place, spec.to_yaml())))
    assert (again.max_recoveries, again.spare_hosts, again.min_nodes) == (2, ("n2", "n3"), 1)


def test_a_dry_run_says_what_a_recovery_would_do(place, capsys) -> None:
    (place / "hosts.ini").write_text("[train_nodes]\n" + "".join(
        f"node{i} ansible_host=127.0.0.{i + 1} ansible_port=1\n" for i in range(3)))
    code, out = run(["train", "-i", str(place / "hosts.ini"), "--nodes", "2",
                     "--max-recoveries", "1", "--spares", "1", "--min-nodes", "1",
                     "--workdir", str(place / "code"), "--dry-run", "job.py"], capsys)
    assert code != 0   # nobody answers on port 1: after the plan's first line
    assert "# dry run: a node's failure would start the run again from its newest " \
           "checkpoint, at most 1 time(s), as " in out, out
    assert "on the healthy nodes and a spare (node2), or on 1 node(s) or more" in out, out


def test_a_missing_job_file_is_named(place, capsys) -> None:
    code, out = run(["train", "-f", str(place / "nope.yaml")], capsys)
    assert code != 0 and f"-f {place / 'nope.yaml'}: No such file or directory" in out


def test_a_secret_env_reaches_the_spec_by_name_and_its_value_nowhere(place, monkeypatch,
                                                                     capsys) -> None:
    """--secret-env NAME: the value stays in this shell's environment; the spec, the job
    file and the dry run's output name the variable only."""
    monkeypatch.setenv("HUB_TOKEN", "s3cr3t-value")
    spec = parse_request(parse(["train", "--secret-env", "HUB_TOKEN", "--workdir",
                                str(place / "code"), "job.py"]))
    assert spec.secret_env == ("HUB_TOKEN",)
    assert "s3cr3t-value" not in spec.to_yaml() and "HUB_TOKEN" in spec.to_yaml()
    assert from_sources(read_job_file(job(place, spec.to_yaml()))).secret_env == (
        "HUB_TOKEN",)
    code, out = run(["train", "-i", str(place / "hosts.ini"), "--nodes", "2",
                     "--secret-env", "HUB_TOKEN", "--workdir", str(place / "code"),
                     "--dry-run", "job.py"], capsys)
    assert "s3cr3t-value" not in out


@pytest.mark.parametrize("argv, words", [
    (["--secret-env", "NOT_SET_ANYWHERE"], "--secret-env NOT_SET_ANYWHERE: not set in this "
                                           "shell's environment; set it first"),
    (["--secret-env", "1BAD"], "--secret-env '1BAD': not a variable name"),
    (["--secret-env", "MASTER_ADDR"], "--secret-env MASTER_ADDR: MASTER_ADDR is set by "
                                      "clustertrain"),
    (["--secret-env", "HUB_TOKEN", "--env", "HUB_TOKEN=x"],
     "--secret-env HUB_TOKEN: also given a value with --env; give it once"),
])
def test_a_bad_secret_env_is_refused_before_any_node(place, monkeypatch, capsys, argv,
                                                     words) -> None:
    monkeypatch.setenv("HUB_TOKEN", "s3cr3t-value")
    monkeypatch.setenv("MASTER_ADDR", "x")
    code, out = run(["train", "-i", str(place / "hosts.ini"), "--nodes", "2", *argv,
                     "--workdir", str(place / "code"), "job.py"], capsys)
    assert code != 0 and words in out, out
    assert "cannot reach" not in out


@pytest.mark.parametrize("text, words", [
    ('workdir: code\nscript: job.py\nnodes: !!int "two"\n',
     'job.yaml line 3: nodes: the tag !!int is not read here; leave it out and write the '
     'value plainly (nodes: "two")'),
    ('workdir: code\nscript: job.py\nqueue: !!bool "yes"\n',
     "job.yaml line 3: queue: the tag !!bool is not read here"),
    ("workdir: code\nscript: job.py\nenv: {LR: !!float 1}\n",
     "job.yaml line 3: env.LR: the tag !!float is not read here"),
    ("a: &a [x, x, x]\nb: &b [*a, *a, *a]\nargs: *b\n",
     "job.yaml line 2: b[0]: *a repeats the value anchored on line 1; this file takes no "
     "aliases: write the value out"),
])
def test_a_tag_or_alias_in_a_job_file_is_refused_not_trusted(place, capsys, text,
                                                              words) -> None:
    """`nodes: !!int "two"` was a traceback and `queue: !!bool "yes"` read as false."""
    code, out = run(["train", "-f", str(job(place, text)), "-i", str(place / "hosts.ini")],
                    capsys)
    assert code == 2 and words in out, out
    assert "Traceback" not in out and "cannot reach" not in out


@pytest.mark.parametrize("text, words", [
    ("workdir:\nscript: job.py\n", "job.yaml line 1: workdir is empty; give a directory, "
                                   "or remove the line to use the default"),
    ("workdir: ~\n", "job.yaml line 1: workdir is null; give a directory, or remove the "
                     "line to use the default"),
    ("workdir: null\n", "job.yaml line 1: workdir is null; give a directory"),
    ("workdir: code\nscript:\n", "job.yaml line 2: script is empty; give a path relative "
                                 "to workdir"),
    ("workdir: code\nscript: job.py\nargs:\n", "job.yaml line 3: args is empty; give a list"),
    ("workdir: code\nscript: job.py\nenv:\n", "job.yaml line 3: env is empty"),
    ("workdir: code\nscript: job.py\nnodes:\n", "job.yaml line 3: nodes is empty; give a "
                                               "whole number"),
    ("workdir: code\nscript: job.py\npartition:\nqueue: true\n",
     "job.yaml line 3: partition is empty"),
    ("workdir: code\nscript: job.py\nqueue: null\n", "job.yaml line 3: queue is null; give "
                                                     "true or false"),
])
def test_a_key_given_no_value_is_refused_not_taken_for_the_default(place, capsys, text,
                                                                   words) -> None:
    """A blank `workdir:` ran the repository's example job instead of the user's code."""
    code, out = run(["train", "-f", str(job(place, text)), "-i", str(place / "hosts.ini")],
                    capsys)
    assert code == 2 and words in out, out
    assert "cannot reach" not in out


def test_a_null_that_a_dry_run_writes_is_that_options_none(place) -> None:
    """`--dry-run` writes every option, `nodes: null` (all of train_nodes) too: read back,
    a written null is the option's own none; empty values inside keep their meaning:
    `FOO:` under env is FOO set to "" (as `--env FOO=`), `""` an empty argument (as
    `-- ""`)."""
    given = read_job_file(job(place, "workdir: code\nscript: job.py\nnodes: null\n"
                                     "hosts: ~\nmaster_port: null\nrun_id: null\n"
                                     "env: {A: '', B: , C: ~}\nargs: [--tag, '']\n"))
    spec = from_sources(given)
    assert (spec.nodes, spec.hosts, spec.master_port, spec.run_id) == (None,) * 4
    assert spec.env == {"A": "", "B": "", "C": ""} and spec.script_args == ("--tag", "")
