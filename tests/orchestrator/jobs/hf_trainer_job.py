"""A Hugging Face `Trainer` script as its users write it: a tiny GPT-2 made from a config
(nothing downloaded), a dataset in memory, checkpoints on the share, and the second launch
resuming from the last one (`resume_from_checkpoint`). It knows nothing of clustertrain.

    hf_trainer_job.py --out DIR --steps N
"""
import argparse
import os

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=40)
args = parser.parse_args()
torch.set_num_threads(1)


class Tokens(torch.utils.data.Dataset):
    """Sequences of 32 token ids from a fixed generator, each its own label."""

    def __init__(self, count: int) -> None:
        self.ids = torch.randint(0, 128, (count, 32), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class CheckpointDirFirst(TrainerCallback):
    """Rank 0 makes each checkpoint's directory, and every rank waits for it, before the
    Trainer saves: every rank writes its RNG state into it, and the first to get there
    makes it. On the sandbox's share (a FUSE daemon per node, which makes a directory as
    root and then gives it to its user) another node writing into it at that moment was
    refused (Permission denied); a real NFS server makes it as the user at once."""

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save and torch.distributed.is_initialized():
            if state.is_world_process_zero:
                os.makedirs(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"),
                            exist_ok=True)
            torch.distributed.barrier()


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2,
                                   n_head=2))
training = TrainingArguments(output_dir=args.out, max_steps=args.steps,
                             per_device_train_batch_size=8, learning_rate=1e-3,
                             save_strategy="steps", save_steps=15, save_total_limit=2,
                             logging_steps=15, report_to=[], use_cpu=True,
                             ddp_backend="gloo", disable_tqdm=True, dataloader_num_workers=0)
last = get_last_checkpoint(args.out) if os.path.isdir(args.out) else None
if last and int(os.environ.get("RANK", "0")) == 0:
    print(f"resuming from {os.path.basename(last)}", flush=True)
trainer = Trainer(model=model, args=training, train_dataset=Tokens(2048),
                  callbacks=[CheckpointDirFirst()])
result = trainer.train(resume_from_checkpoint=last)
if trainer.is_world_process_zero():
    print(f"trained to step {trainer.state.global_step}", flush=True)
