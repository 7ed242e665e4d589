"""Run by torchrun from test_trainer.py: every rank saves three checkpoints with the job's
own checkpointer, then a fresh Trainer on every rank resumes while torch.load counts
the checkpoint files read. Each rank writes what it read and where it resumed to
OUT_DIR/rank<N>.json.

    torchrun ... resume_probe.py OUT_DIR <train.py arguments>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TRAIN_DIR = Path(__file__).resolve().parents[2] / "train"
sys.path.insert(0, str(TRAIN_DIR))

import torch  # noqa: E402

import data as cifar  # noqa: E402
import distributed  # noqa: E402
import train  # noqa: E402
from trainer import Trainer  # noqa: E402


def main() -> None:
    out_dir = Path(sys.argv[1])
    args = train.parse_args(sys.argv[2:])
    env = distributed.setup(args.backend, args.device)
    try:
        train.seed_everything(args.seed, env.rank, args.deterministic)
        data = cifar.load_cifar(args.data_dir)
        writer = Trainer(args, env, data)
        for step in range(3):
            writer.train_step(torch.arange(step * 32, (step + 1) * 32))
            train.checkpointer_for(writer).save(writer)
        writer.close()
        distributed.barrier(env)

        real_load, reads = torch.load, []

        def counting_load(f, *a, **kw):
            if isinstance(f, (str, Path)):
                reads.append(Path(f).name)
            return real_load(f, *a, **kw)

        torch.load = counting_load
        resumed = Trainer(args, env, data)
        path = train.checkpointer_for(resumed).restore(resumed)
        resumed.close()
        (out_dir / f"rank{env.rank}.json").write_text(json.dumps(
            {"reads": reads, "restored": path.name if path else None,
             "epoch": resumed.position.epoch, "step": resumed.position.step}))
        distributed.barrier(env)
    finally:
        distributed.teardown(env)


if __name__ == "__main__":
    main()
