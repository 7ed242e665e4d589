"""A sweep file (orchestrator/sweep/sweepfile.py): a job file with a `sweep:` section, read
whole and refused naming the line before anything runs; the trials it stands for."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from orchestrator.errors import InputError
from orchestrator.run.spec import from_sources
from orchestrator.sweep.early import EarlyStop
from orchestrator.sweep.sweepfile import MAX_TRIALS, read_sweep_file

JOB = """\
nodes: 1
queue: true
gpus_per_node: 1
args: [--epochs, "2"]
"""


def sweep_file(tmp_path: Path, section: str, job: str = JOB) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(job + "sweep:\n" + textwrap.indent(textwrap.dedent(section), "  "))
    return path


def test_a_grid_is_every_combination_last_parameter_fastest(tmp_path) -> None:
    given, sweep = read_sweep_file(sweep_file(tmp_path, """\
        method: grid
        parameters:
          --lr: [0.2, 0.05, 0.01]
          --width: [4, 8]
        metric: test_loss
        parallel: 6
        """))
    trials = sweep.expand()
    assert [t.args for t in trials[:3]] == [["--lr", "0.2", "--width", "4"],
                                           ["--lr", "0.2", "--width", "8"],
                                           ["--lr", "0.05", "--width", "4"]]
    assert [t.number for t in trials] == list(range(1, 7))
    assert (sweep.metric, sweep.goal, sweep.parallel, sweep.max_failures) == \
        ("test_loss", "minimize", 6, 3)
    # The rest of the file is the job, as train -f reads it.
    spec = from_sources(given)
    assert (spec.nodes, spec.queue, spec.gpus_per_node) == (1, True, 1)
    assert list(spec.script_args) == ["--epochs", "2"]


def test_random_draws_the_same_trials_from_the_same_seed(tmp_path) -> None:
    section = """\
        method: random
        trials: 50
        seed: 7
        parameters:
          --lr: {min: 1.0e-4, max: 0.1, log: true}
          --width: {min: 4, max: 16}
          --opt: {choice: [adam, sgd]}
          --drop: [0.0, 0.5]
        metric: accuracy
        goal: maximize
        """
    _, sweep = read_sweep_file(sweep_file(tmp_path, section))
    trials = sweep.expand()
    assert trials == read_sweep_file(sweep_file(tmp_path, section))[1].expand()
    assert len(trials) == 50 and sweep.goal == "maximize"
    by = [dict(t.values) for t in trials]
    lrs = [float(b["--lr"]) for b in by]
    assert all(1e-4 <= x <= 0.1 for x in lrs)
    # log: evenly in the logarithm, so about half below the geometric middle (3.2e-3)
    assert 10 <= sum(x < math.sqrt(1e-4 * 0.1) for x in lrs) <= 40
    assert all(b["--width"].isdigit() and 4 <= int(b["--width"]) <= 16 for b in by)
    assert {b["--opt"] for b in by} == {"adam", "sgd"}
    assert {b["--drop"] for b in by} == {"0.0", "0.5"}
    other = sweep_file(tmp_path, section.replace("seed: 7", "seed: 8"))
    assert read_sweep_file(other)[1].expand() != trials


BAD = [
    ("method: grid\nparameters: {--lr: [0.1]}\n", "line 6: sweep needs `metric:`"),
    ("method: bayes\nparameters: {--lr: [0.1]}\nmetric: loss\n",
     "line 6: sweep.method must be grid or random, not 'bayes'"),
    ("method: grid\nparameters:\n  lr: [0.1]\nmetric: loss\n",
     "line 8: sweep.parameters.lr: a parameter is an option of the script, written as the "
     "script takes it (`--lr`)"),
    ("method: grid\nparameters:\n  --lr: {min: 0.001, max: 0.1}\nmetric: loss\n",
     "line 8: sweep.parameters.--lr: a grid takes a list of values, not a range"),
    ("method: random\nparameters:\n  --lr: {min: 0.001, max: 0.1}\nmetric: loss\n",
     "line 6: sweep.method: random needs `trials: N`"),
    ("method: random\ntrials: 4\nparameters:\n  --lr: {min: 0.1, max: 0.001}\nmetric: loss\n",
     "line 9: sweep.parameters.--lr: min (0.1) must be below max (0.001)"),
    ("method: random\ntrials: 4\nparameters:\n  --lr: {min: 0, max: 1, log: true}\n"
     "metric: loss\n", "a range with log: true must be above 0 (min is 0)"),
    ("method: random\ntrials: 4\nparameters:\n  --lr: {min: 1}\nmetric: loss\n",
     "a range needs both min and max"),
    ("method: random\ntrials: 4\nparameters:\n  --lr: {mni: 1, max: 2}\nmetric: loss\n",
     "unknown key 'mni' (did you mean 'min'?)"),
    ("method: grid\nparameters:\n  --lr: [0.1, 0.1]\nmetric: loss\n",
     "sweep.parameters.--lr: 0.1 given more than once"),
    ("method: grid\nparameters:\n  --lr: 0.1\nmetric: loss\n",
     "sweep.parameters.--lr must be a list of its values"),
    ("method: grid\ntrials: 3\nparameters: {--lr: [0.1]}\nmetric: loss\n",
     "line 7: sweep.trials: a grid runs every combination"),
    ("method: grid\nparameters: {--lr: [0.1]}\nmetric: loss\ngoal: lowest\n",
     "line 9: sweep.goal must be minimize or maximize, not 'lowest'"),
    ("method: grid\nparameters: {--lr: [0.1]}\nmetric: loss\nparallel: 0\n",
     "line 9: sweep.parallel must be at least 1, not 0"),
    ("method: grid\nparameters: {--lr: [0.1]}\nmetric: loss\nearly: yes\n",
     "line 9: unknown key 'early'"),
    ("method: grid\nparameters: {--lr: [0.1]}\nmetric: loss\n"
     "early_stop: {method: hyperband, after: 10}\n",
     "line 9: sweep.early_stop must be {method: median, after: STEPS} (and min_trials: N, 3 "
     "by default), not method 'hyperband'"),
    ("method: grid\nparameters: {--lr: [0.1]}\nmetric: loss\nearly_stop: {method: median}\n",
     "line 9: sweep.early_stop must be {method: median, after: STEPS}"),
    ("method: grid\nparameters: {--lr: [0.1]}\nmetric: loss\n"
     "early_stop: {method: median, after: 5, patience: 2}\n", "unknown key 'patience'"),
    ("method: grid\nparameters: {--lr: [0.1]}\nmetric: loss\n"
     "early_stop: {method: median, after: 5, min_trials: 0}\n",
     "line 9: sweep.early_stop: after must be at least 0 and min_trials at least 1"),
    ("method: grid\nparameters: {--epochs: [1, 2]}\nmetric: loss\n",
     "line 4: args: --epochs is given there and swept: take it out of args"),
    ("method: random\ntrials: 5000\nparameters: {--lr: [0.1]}\nmetric: loss\n",
     f"5000 trials; a sweep runs at most {MAX_TRIALS}"),
    # a key given no value is no default: it was minimize, and a linear range
    ("method: grid\nparameters: {--lr: [0.1]}\nmetric: loss\ngoal:\n",
     "line 9: sweep.goal is empty; give text, or remove the line to use the default"),
    ("method: random\ntrials: 4\nparameters:\n  --lr: {min: 0.1, max: 1, log: ~}\n"
     "metric: loss\n", "line 9: sweep.parameters.--lr.log is null; give true or false"),
]


@pytest.mark.parametrize(("section", "said"), BAD, ids=[b[1][:40] for b in BAD])
def test_a_bad_sweep_is_refused_naming_the_line_and_the_fix(tmp_path, section, said) -> None:
    path = sweep_file(tmp_path, section)
    with pytest.raises(InputError) as refused:
        read_sweep_file(path)
    assert said in str(refused.value), str(refused.value)
    assert str(path) in str(refused.value)


def test_early_stop_is_read_with_its_default_min_trials(tmp_path) -> None:
    _, sweep = read_sweep_file(sweep_file(tmp_path, """\
        method: grid
        parameters: {--lr: [0.1, 0.01]}
        metric: loss
        early_stop: {method: median, after: 200}
        """))
    assert sweep.early_stop == EarlyStop(after=200, min_trials=3)
    _, plain = read_sweep_file(sweep_file(tmp_path, "method: grid\nparameters: {--lr: [1]}\n"
                                                    "metric: loss\n"))
    assert plain.early_stop is None


def test_a_grid_too_big_is_refused_with_its_count(tmp_path) -> None:
    values = ", ".join(str(i) for i in range(40))
    path = sweep_file(tmp_path, f"method: grid\nparameters:\n  --a: [{values}]\n"
                                f"  --b: [{values}]\nmetric: loss\n")
    with pytest.raises(InputError, match=f"1600 trials; a sweep runs at most {MAX_TRIALS}"):
        read_sweep_file(path)


def test_a_job_file_without_a_sweep_section_is_refused(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    with pytest.raises(InputError, match="has no `sweep:` section"):
        read_sweep_file(path)


def test_the_jobs_own_keys_are_checked_as_train_checks_them(tmp_path) -> None:
    path = sweep_file(tmp_path, "method: grid\nparameters: {--lr: [0.1]}\nmetric: loss\n",
                      job="nodse: 2\n")
    with pytest.raises(InputError, match="line 1: unknown key 'nodse' \\(did you mean "
                                         "'nodes'\\?\\)"):
        read_sweep_file(path)
