"""The training job's state and its steps.

A `Trainer` holds the model, the optimizer, the learning-rate schedule, the random
streams, where training stands (epoch and step) and the metrics so far. All of it
goes into `state_dict()` and comes back with `load_state_dict()`, which is what the
checkpointer (checkpoint.Checkpointer) saves and restores. `close()` releases what
the trainer took from the process (its signal handlers) and is called on every way
out of the job.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

import data as cifar
import distributed
from checkpoint import Position
from model import build_model

# Settings that a resumed run must share with its checkpoint. The steps per epoch may
# change, with the world size or the batch size (a --min-nodes recovery): the schedule is
# then laid over the new steps (`schedule_at`).
RESUME_KEYS = ("epochs", "width", "blocks", "optimizer", "schedule")
# What a schedule sets in the optimizer's groups as it steps (OneCycleLR cycles momentum).
SCHEDULED = ("lr", "momentum", "betas")


class SettingsMismatchError(ValueError):
    """A checkpoint was made with settings this run does not have."""


class StopRequest:
    """Set by SIGTERM/SIGINT once installed; the training loop checks it between steps."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:  # asked twice: stop now, without saving
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.signum = signum


class StepBeat:
    """The beat line the orchestrator reads (`##clustertrain beat`, see
    orchestrator/record/progress.py): this rank makes progress, and its own time per step (the
    batch's preparation and the forward pass, where it waits for no other rank), so that
    a slow node shows. At most one line per INTERVAL seconds: the median of its steps."""

    INTERVAL = 1.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last = clock()
        self.times: list[float] = []
        self.samples = 0

    def step(self, own_s: float, samples: int, step: int | None = None,
             loss: Any = None) -> None:
        """LOSS: this step's loss (a tensor: read, which waits for the GPU, only when a
        beat is printed)."""
        self.times.append(own_s)
        self.samples += samples
        now = self.clock()
        if now - self.last >= self.INTERVAL:
            print(f"##clustertrain beat step_s={statistics.median(self.times):.6f} "
                  f"samples={round(self.samples / len(self.times))}"
                  + (f" step={step}" if step is not None else "")
                  + (f" loss={float(loss):.6g}" if loss is not None else ""), flush=True)
            self.last, self.times, self.samples = now, [], 0


def log(env: distributed.DistEnv, msg: str) -> None:
    if env.is_main:
        print(msg, flush=True)


def epoch_generator_seed(seed: int, epoch: int, rank: int) -> int:
    return (seed * 1_000_003 + epoch * 10_007 + rank) % (2**63)


def make_optimizer(args: argparse.Namespace, model: nn.Module) -> torch.optim.Optimizer:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():
        (no_decay if p.ndim <= 1 else decay).append(p)  # biases and norm scales
    if args.optimizer == "sgd":
        lr = args.lr or 0.1
        wd = 5e-4 if args.weight_decay is None else args.weight_decay
        groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.SGD(groups, lr=lr, momentum=args.momentum, nesterov=True)
    lr = args.lr or 2e-3
    wd = 0.05 if args.weight_decay is None else args.weight_decay
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr)


def make_scheduler(args: argparse.Namespace, optimizer: torch.optim.Optimizer,
                   total_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    peak = optimizer.param_groups[0]["lr"]
    if args.schedule == "onecycle":
        # OneCycleLR needs a step in each of its two phases: the warm-up takes a quarter,
        # at least 2 steps of a short run (--epochs 1 on a small dataset); fewer than 3
        # steps in all keep the peak rate.
        if total_steps < 3:
            return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=peak, total_steps=total_steps,
            pct_start=max(0.25, 2 / total_steps))
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)


class Trainer:
    """Model, optimizer, schedule, random streams, position and metrics of one process."""

    def __init__(self, args: argparse.Namespace, env: distributed.DistEnv,
                 data: cifar.Cifar) -> None:
        self.args, self.env, self.data = args, env, data
        self.ctrl = distributed.control_group(env)  # CPU group for small messages
        self.channels_last = env.device.type == "cuda"
        core = build_model(args.width, args.blocks, num_classes=len(data.classes)).to(env.device)
        if self.channels_last:
            # torch's stubs leave memory_format out of Module.to's overloads; it takes it.
            core = core.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.core: nn.Module = core   # the bare model: evaluation and checkpoints
        self.model: nn.Module = core  # what trains: the DDP wrapper with a process group
        if env.distributed:
            self.model = DDP(core, device_ids=[env.local_rank] if env.device.type == "cuda"
                             else None)
        # When the bare model's forward starts: after DDP's buffer broadcast, a wait.
        self._forward_at = 0.0
        core.register_forward_pre_hook(self._forward_starts)
        self.beat = StepBeat()
        # A range of indices stands in for the dataset: the sampler only takes its len().
        self.sampler: DistributedSampler[int] = DistributedSampler(
            range(len(data.train_y)),  # type: ignore[arg-type]
            num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=args.seed,
            drop_last=True)
        self.steps_per_epoch = math.ceil(len(self.sampler) / args.batch_size)
        self.optimizer = make_optimizer(args, core)
        self.scheduler = make_scheduler(args, self.optimizer,
                                        total_steps=self.steps_per_epoch * args.epochs)
        self.amp = args.amp == "on" or (args.amp == "auto" and env.device.type == "cuda")
        self.aug_gen = torch.Generator()
        self.position = Position(0, 0)
        self.history: list[dict[str, Any]] = []
        # The interrupted epoch's summed [loss, correct, samples] over all ranks, carried
        # by rank 0, so that its metrics still cover the whole epoch after a resume.
        self.partial = [0.0, 0.0, 0.0]
        self.resumed_from: dict[str, int] | None = None
        self.stop = StopRequest()

    # -- state --------------------------------------------------------------------------
    def signature(self) -> dict[str, Any]:
        a = self.args
        return {"epochs": a.epochs, "steps_per_epoch": self.steps_per_epoch,
                "world_size": self.env.world_size, "batch_size": a.batch_size,
                "width": a.width, "blocks": a.blocks, "optimizer": a.optimizer,
                "schedule": a.schedule}

    def _rng_state(self) -> dict[str, Any]:
        return {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state() if self.env.device.type == "cuda" else None,
                "python": random.getstate(),
                "augment": self.aug_gen.get_state()}

    def _set_rng_state(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        if state.get("cuda") is not None and self.env.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"])
        random.setstate(state["python"])
        self.aug_gen.set_state(state["augment"])

    def state_dict(self) -> dict[str, Any]:
        """The whole job's state. Collective: every rank calls it; `rng`, the random
        streams of all ranks in rank order, is gathered on rank 0 (the rank that writes)
        and None elsewhere."""
        return {"model": self.core.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng": distributed.gather_to_main(self._rng_state(), self.env, group=self.ctrl),
                "signature": self.signature(), "history": list(self.history),
                "partial_epoch": list(self.partial),
                "epoch": self.position.epoch, "step": self.position.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`. Refuses one made with other model or schedule settings;
        after a change of world size or batch size an interrupted epoch starts over."""
        sig, now = state["signature"], self.signature()
        changed = [k for k in RESUME_KEYS if sig.get(k) != now[k]]
        if changed:
            diff = ", ".join(f"{k}: {sig.get(k)} -> {now[k]}" for k in changed)
            raise SettingsMismatchError(
                f"was made with other settings ({diff}); rerun with the same settings, or "
                "use another --run-name (or --no-resume) to start a new run")
        self.core.load_state_dict(state["model"])
        pos = Position(int(state["epoch"]), int(state["step"]))
        rngs = state["rng"]
        if len(rngs) == self.env.world_size and sig["batch_size"] == now["batch_size"]:
            self._set_rng_state(rngs[self.env.rank])
        elif pos.step:
            log(self.env, "world size or batch size changed: restarting the interrupted epoch")
            pos = Position(pos.epoch, 0)
        if sig.get("steps_per_epoch") == now["steps_per_epoch"]:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        else:
            self.schedule_at(pos.epoch * self.steps_per_epoch, state["optimizer"])
        self.history = list(state["history"])
        carried = pos.step and self.env.is_main  # rank 0 carries the whole job's partial sums
        self.partial = ([float(v) for v in state.get("partial_epoch", [0.0, 0.0, 0.0])]
                        if carried else [0.0, 0.0, 0.0])
        self.position = pos
        self.resumed_from = {"epoch": pos.epoch, "step": pos.step}

    def schedule_at(self, done: int, optimizer_state: dict[str, Any]) -> None:
        """The checkpoint's optimizer state (its moments), under this run's schedule after
        DONE of its steps: the schedule is replayed on the new steps (a few thousand
        steps of arithmetic), since the saved one counted other steps."""
        with warnings.catch_warnings():   # "lr_scheduler.step() before optimizer.step()"
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(done):
                self.scheduler.step()
        scheduled = [{k: g[k] for k in SCHEDULED if k in g}
                     for g in self.optimizer.param_groups]
        self.optimizer.load_state_dict(optimizer_state)
        for group, values in zip(self.optimizer.param_groups, scheduled, strict=True):
            group.update(values)

    def close(self) -> None:
        """Give back what the trainer took from the process: the signal handlers."""
        self.stop.uninstall()

    # -- training -----------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        if not self.amp:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.env.device.type, dtype=torch.bfloat16)

    def _input(self, x_uint8: torch.Tensor, train: bool) -> torch.Tensor:
        x = cifar.normalize(x_uint8, self.env.device)
        if train and not self.args.no_augment:
            x = cifar.augment(x, self.aug_gen)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def _forward_starts(self, _module: nn.Module, _inputs: Any) -> None:
        self._forward_at = time.perf_counter()

    def train_step(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step on the training images `idx`: (mean loss, correct count).
        Beats with this rank's own time: the batch's preparation and the forward pass (on
        a GPU, the time to queue its kernels)."""
        t0 = time.perf_counter()
        x = self._input(self.data.train_x[idx], train=True)
        y = self.data.train_y[idx].to(self.env.device, non_blocking=True)
        prepared = time.perf_counter()
        with self._autocast():
            out = self.model(x)
            loss = nn.functional.cross_entropy(out.float(), y)
        self.beat.step(prepared - t0 + time.perf_counter() - self._forward_at, len(idx),
                       self.global_step + 1, loss.detach())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.position = Position(self.position.epoch, self.position.step + 1)
        return loss.detach(), (out.detach().argmax(1) == y).sum()

    def _record_indices(self, epoch: int, indices: list[int]) -> None:
        out = self.args.debug_record_indices
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{self.env.rank}-epoch{epoch}.json").write_text(json.dumps(indices))

    @property
    def global_step(self) -> int:
        """Steps done since the start of training (every epoch's)."""
        return self.position.epoch * self.steps_per_epoch + self.position.step

    def train_epoch(self, stop_requested: Callable[[], bool]) -> dict[str, Any] | None:
        """Run the current epoch from its current step; its metrics, or None when a stop
        was requested (the position and partial sums are then ready to be saved)."""
        env, args = self.env, self.args
        epoch, start_step = self.position.epoch, self.position.step
        self.model.train()
        self.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        indices = list(self.sampler)
        if args.debug_record_indices is not None:
            self._record_indices(epoch, indices)
        if start_step == 0:
            self.aug_gen.manual_seed(epoch_generator_seed(args.seed, epoch, env.rank))
        carried, self.partial = self.partial, [0.0, 0.0, 0.0]  # sums from before a stop
        loss_sum = torch.zeros((), dtype=torch.float64, device=env.device)
        correct = torch.zeros((), dtype=torch.int64, device=env.device)
        seen = 0
        t0 = time.perf_counter()
        for step, idx in enumerate(cifar.batches(indices, args.batch_size)):
            if step < start_step:
                continue
            loss, right = self.train_step(idx)
            loss_sum += loss.double() * len(idx)
            correct += right
            seen += len(idx)
            if env.is_main and (step + 1) % args.log_every == 0:
                print(f"epoch {epoch + 1} step {step + 1}/{self.steps_per_epoch} "
                      f"loss {loss.item():.4f} lr {self.scheduler.get_last_lr()[0]:.5f}",
                      flush=True)
            if distributed.any_rank(stop_requested(), env, self.ctrl):
                log(env, f"stop requested: saving epoch {epoch + 1} at step {step + 1}")
                self.partial = distributed.sum_across(
                    [loss_sum.item() + carried[0], correct.item() + carried[1],
                     seen + carried[2]], env)
                return None
        loss_total, correct_total, seen_total, seen_now = distributed.sum_across(
            [loss_sum.item() + carried[0], correct.item() + carried[1], seen + carried[2],
             seen], env)
        elapsed = time.perf_counter() - t0
        self.position = Position(epoch + 1, 0)
        return {"epoch": epoch + 1, "train_loss": loss_total / max(seen_total, 1),
                "train_acc": correct_total / max(seen_total, 1),
                "samples_per_s": seen_now / elapsed, "train_time_s": elapsed,
                "lr": self.scheduler.get_last_lr()[0]}

    def evaluate(self) -> tuple[float, float]:
        """Each rank scores a disjoint shard of the test set; counts are summed over ranks."""
        self.core.eval()
        d, env = self.data, self.env
        shard = cifar.eval_shard(len(d.test_y), env.rank, env.world_size)
        loss_sum = torch.zeros((), dtype=torch.float64, device=env.device)
        correct = torch.zeros((), dtype=torch.int64, device=env.device)
        with torch.no_grad(), self._autocast():
            for idx in cifar.batches(shard, self.args.batch_size * 2):
                x = self._input(d.test_x[idx], train=False)
                y = d.test_y[idx].to(env.device, non_blocking=True)
                out = self.core(x).float()
                loss_sum += nn.functional.cross_entropy(out, y, reduction="sum")
                correct += (out.argmax(1) == y).sum()
        total_loss, total_correct, n = distributed.sum_across(
            [loss_sum.item(), float(correct.item()), float(len(shard))], env)
        return total_loss / n, total_correct / n
