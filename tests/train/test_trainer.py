"""train/trainer.py and the checkpointer, in one process on CPU with real checkpoint files.

A Trainer's state_dict()/load_state_dict() must carry everything a continued run
depends on (weights, optimizer momentum, schedule, random streams, position,
history): a trainer restored from a checkpoint takes the same next step as the
one that saved it. A resume reads one checkpoint file, once.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from .conftest import TINY, TRAIN_PY, job_env, torchrun_cmd


@pytest.fixture
def job(train_modules, synthetic_dir, tmp_path):
    """Builds trainers as train.py does, for one process on CPU."""
    train, trainer_mod = train_modules("train"), train_modules("trainer")
    ckpt, distributed = train_modules("checkpoint"), train_modules("distributed")
    data = train_modules("data").load_cifar(synthetic_dir)
    args = train.parse_args(["--data-dir", str(synthetic_dir), "--checkpoint-dir",
                             str(tmp_path / "ckpt"), "--device", "cpu", "--epochs", "2", *TINY])
    env = distributed.DistEnv(rank=0, local_rank=0, world_size=1,
                              device=torch.device("cpu"), backend=None)
    train.seed_everything(args.seed, env.rank, args.deterministic)

    class Job:
        store = ckpt.CheckpointStore(args.checkpoint_dir, keep=args.keep)
        checkpointer = ckpt.Checkpointer(store)

        @staticmethod
        def trainer():
            t = trainer_mod.Trainer(args, env, data)
            made.append(t)
            return t

        @staticmethod
        def batch(i: int) -> torch.Tensor:
            return torch.arange(i * 32, (i + 1) * 32)

    made: list = []
    yield Job
    for t in made:
        t.close()


def tensors_equal(a, b) -> bool:
    """Deep equality of (nested) state dicts holding tensors."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(tensors_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_saved_and_restored_trainer_takes_the_same_next_step(job):
    first = job.trainer()
    first.train_step(job.batch(0))
    first.history.append({"epoch": 0, "train_loss": 2.5})
    saved = job.checkpointer.save(first)
    assert saved is not None and saved.name == "ckpt-000000-0000001.pt"

    second = job.trainer()  # other initial weights: the random stream moved on
    assert not tensors_equal(first.core.state_dict(), second.core.state_dict())
    assert job.checkpointer.restore(second) == saved

    assert tensors_equal(first.core.state_dict(), second.core.state_dict())
    assert tensors_equal(first.optimizer.state_dict(), second.optimizer.state_dict())
    assert first.optimizer.state_dict()["state"], "no momentum was saved: test too weak"
    assert first.scheduler.get_last_lr() == second.scheduler.get_last_lr()
    assert second.position == first.position and second.position.step == 1
    assert second.history == first.history
    assert second.resumed_from == {"epoch": 0, "step": 1}

    loss_first, _ = first.train_step(job.batch(1))
    loss_second, _ = second.train_step(job.batch(1))
    assert loss_second.item() == loss_first.item()
    assert tensors_equal(first.core.state_dict(), second.core.state_dict())


def test_restore_into_a_trainer_with_other_settings_names_the_checkpoint(job, train_modules):
    ckpt = train_modules("checkpoint")
    first = job.trainer()
    first.train_step(job.batch(0))
    saved = job.checkpointer.save(first)
    other = job.trainer()
    other.args = type(other.args)(**{**vars(other.args), "epochs": 5})
    with pytest.raises(ckpt.RestoreError, match=rf"checkpoint {saved} was made with other "
                                                r"settings \(epochs: 2 -> 5\)"):
        job.checkpointer.restore(other)


def test_resume_reads_the_newest_checkpoint_once(job, monkeypatch):
    trainer = job.trainer()
    for i in range(3):  # three checkpoints on disk: steps 1, 2, 3
        trainer.train_step(job.batch(i))
        job.checkpointer.save(trainer)
    assert len(job.store.positions()) == 3

    real_load, reads = torch.load, []

    def counting_load(f, *args, **kwargs):
        reads.append(Path(f).name)
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting_load)
    resumed = job.trainer()
    path = job.checkpointer.restore(resumed)
    assert reads == ["ckpt-000000-0000003.pt"], f"checkpoint reads during a resume: {reads}"
    assert path.name == "ckpt-000000-0000003.pt" and resumed.position.step == 3


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_rank_reads_the_chosen_checkpoint_once_and_resumes_at_the_same_step(
        synthetic_dir, tmp_path):
    """Two processes under torchrun (gloo): rank 0 chooses, each rank reads that file once."""
    out = tmp_path / "out"
    out.mkdir()
    probe = Path(__file__).with_name("resume_probe.py")
    cmd = torchrun_cmd(2, "--data-dir", str(synthetic_dir), "--checkpoint-dir",
                       str(tmp_path / "ckpt"), "--epochs", "2", *TINY)
    job_at = cmd.index(str(TRAIN_PY))  # the worker runner starts the probe instead of the job
    cmd = [*cmd[:job_at], str(probe), str(out), *cmd[job_at + 1:]]
    proc = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r, got in enumerate(ranks):
        assert got["reads"] == ["ckpt-000000-0000003.pt"], f"rank {r} read {got['reads']}"
        assert got["restored"] == "ckpt-000000-0000003.pt"
        assert (got["epoch"], got["step"]) == (0, 3), f"rank {r} resumed at {got}"


def test_training_steps_beat_at_most_once_a_second_with_their_own_time(job, capsys,
                                                                       train_modules) -> None:
    """The beat the orchestrator reads (orchestrator/record/progress.py): one line per second at
    most, with the median of this rank's own step times and the batch size."""
    from orchestrator.record.progress import Beat, parse_beat

    beat = train_modules("trainer").StepBeat(clock=iter([0.0, 0.4, 0.8, 1.2, 1.5]).__next__)
    for own in (0.3, 0.1, 0.2):
        beat.step(own, 32)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and parse_beat(lines[0]) == Beat(0.2, 32)  # median of the three
    beat.step(0.5, 16)  # 0.3 s after the last beat: no line
    assert capsys.readouterr().out == ""

    t = job.trainer()
    t.beat.last = float("-inf")  # due at once
    t.train_step(job.batch(0))
    [line] = capsys.readouterr().out.splitlines()
    b = parse_beat(line)
    assert b is not None and b.samples == 32 and b.step_s is not None and 0 < b.step_s < 10
    assert b.step == 1 and b.loss is not None and 0 < b.loss < 20   # the step's loss
