"""`sweep` at the door (issue 66): a sweep file's nodes, hosts and queue are checked as
`train` checks a run's, before the sweep's record (its directory, sweep.json) is written
and before any node is touched; a sweep's record that cannot be read is said, naming the
file and the fix, by every verb that reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.sweep.record import SWEEP_JSON, new_sweep
from orchestrator.sweep.sweepfile import Parameter, SweepSpec

from ...clirun import run_cli as run

SECTION = "sweep:\n  method: grid\n  parameters: {--lr: [0.1, 0.01]}\n  metric: loss\n"


def error_line(said: str) -> str:
    return next(line for line in said.splitlines() if line.startswith("error: "))


def refused_as_train_refuses(job: str, setup: tuple[list[str], Path], tmp_path: Path,
                             capsys) -> str:
    """The sweep of JOB (and SECTION) refused with exit 2 and the error `train -f JOB`
    gives, nothing recorded under the runs directory; that error."""
    train, runs = setup
    inventory = train[train.index("-i") + 1]
    (tmp_path / "job.yaml").write_text(job)
    (tmp_path / "sweep.yaml").write_text(job + SECTION)
    code, said = run(["sweep", "-f", str(tmp_path / "sweep.yaml"), "-i", inventory,
                      "--runs-dir", str(runs)], capsys)
    assert code == 2, said
    assert not runs.exists(), sorted(runs.rglob("*"))
    code, by_train = run(["train", "-f", str(tmp_path / "job.yaml"), "-i", inventory,
                          "--runs-dir", str(runs)], capsys)
    assert code == 2, by_train
    assert error_line(said) == error_line(by_train)
    return error_line(said)


@pytest.mark.parametrize(("job", "says"), [
    ("nodes: 3\n", "--nodes 3: the inventory"),                   # silently 2 before
    ("nodes: 0\n", "--nodes 0: a job needs at least 1 node"),     # every node before
    ("hosts: [node0, node7]\n", "--hosts: unknown host(s) node7"),
    ("hosts: [node1, node1]\n", "a host is named twice"),
    ("queue: true\nnodes: 1\ngpus_per_node: 1\n", "so the cluster runs no Slurm"),
], ids=["nodes-above", "nodes-0", "hosts-unknown", "hosts-twice", "queue-no-slurm"])
def test_a_sweep_whose_nodes_train_refuses_is_refused_before_it_is_recorded(
        setup, tmp_path: Path, capsys, job: str, says: str) -> None:
    assert says in refused_as_train_refuses(job, setup, tmp_path, capsys)


def test_through_the_queue_a_trial_above_the_slurm_nodes_is_refused_at_the_door(
        setup, tmp_path: Path, capsys) -> None:
    """With Slurm, a trial of more nodes than the inventory's (Slurm's) never runs."""
    train, _ = setup
    inventory = Path(train[train.index("-i") + 1])
    inventory.write_text(inventory.read_text() + "cluster_scheduler=slurm\n")
    said = refused_as_train_refuses("queue: true\nnodes: 3\ngpus_per_node: 1\n", setup,
                                    tmp_path, capsys)
    assert "--nodes 3: the inventory" in said and "has only 2 node(s)" in said


def test_a_trial_of_more_nodes_than_the_hosts_it_shares_is_refused(
        setup, tmp_path: Path, capsys) -> None:
    """`hosts` with `nodes`: the trials share out those hosts, `nodes` each."""
    train, runs = setup
    path = tmp_path / "sweep.yaml"
    path.write_text("hosts: [node1]\nnodes: 2\n" + SECTION)
    code, said = run(["sweep", "-f", str(path), "-i", train[train.index("-i") + 1],
                      "--runs-dir", str(runs)], capsys)
    assert code == 2, said
    assert "--nodes 2: --hosts names 1 node(s) (node1)" in said, said
    assert "use --nodes 1 or fewer, or name more hosts" in said
    assert not runs.exists()


def test_resume_checks_the_nodes_again_before_it_touches_the_record(
        setup, tmp_path: Path, capsys) -> None:
    """The inventory changed since: `sweep resume` refuses as the first start would."""
    train, _ = setup
    inventory = Path(train[train.index("-i") + 1])
    sweep = SweepSpec("grid", (Parameter("--lr", ("0.1",)),), "loss")
    record = new_sweep(tmp_path / "runs", tmp_path / "s.yaml", sweep, sweep.expand(), 1)
    (record.path / "job.yaml").write_text(f"inventory: {inventory}\nnodes: 2\n")
    record.state = "stopped"
    record.save()
    (record.path / "stop-requested").touch()
    inventory.write_text("\n".join(line for line in inventory.read_text().splitlines()
                                   if not line.startswith("node1")) + "\n")
    before = (record.path / SWEEP_JSON).read_text()
    code, said = run(["sweep", "resume", record.sweep_id, "--runs-dir",
                      str(record.runs_dir)], capsys)
    assert code == 2, said
    assert "--nodes 2: the inventory" in said and "has only 1 node(s)" in said
    assert (record.path / SWEEP_JSON).read_text() == before
    assert (record.path / "stop-requested").exists()


BROKEN = [
    ("not json {", "is not JSON"),
    ('{"sweep_id": "x", "trials": [', "is not JSON"),
    ("[1, 2]", "is not a JSON object"),
    ('{"sweep_id": "x"}', "lacks"),
]


@pytest.mark.parametrize("verb", ["show", "resume", "stop"])
@pytest.mark.parametrize(("text", "says"), BROKEN, ids=["not-json", "cut-short", "a-list",
                                                         "missing-keys"])
def test_a_sweep_json_that_cannot_be_read_is_named_with_the_fix(
        tmp_path: Path, capsys, verb: str, text: str, says: str) -> None:
    sweep = SweepSpec("grid", (Parameter("--lr", ("0.1",)),), "loss")
    record = new_sweep(tmp_path, tmp_path / "s.yaml", sweep, sweep.expand(), 1)
    path = record.path / SWEEP_JSON
    path.write_text(text)
    code, said = run(["sweep", verb, record.sweep_id, "--runs-dir", str(tmp_path)], capsys)
    assert code == 2, said
    assert "Traceback" not in said
    assert str(path) in said and says in said, said
    assert f"restore the file, or remove the sweep's directory {record.path}/" in said, said
    assert path.read_text() == text   # left as it was found
