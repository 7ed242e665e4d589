"""Train a small ResNet on CIFAR-10 with DistributedDataParallel.

    torchrun --nnodes N --nproc-per-node G ... train.py [--epochs 30] [--width 32] ...
    python train.py ...                      # one process, no process group

NCCL with GPUs, gloo without; rank 0 logs and saves checkpoints; a restarted job
(torchrun --max-restarts, or running the same command again) resumes from the
newest complete checkpoint in --checkpoint-dir. Rank 0 prints a final line
`FINAL_METRICS {json}` and writes the same metrics, with the per-epoch history,
to --metrics-json.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import math
import os
import random
import signal
import socket
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # numpy is optional
import torch  # noqa: E402
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

import checkpoint as ckpt
import data as cifar
import distributed
from model import build_model, parameter_count

SHARED = Path("/mnt/cluster")
EXIT_STOPPED = 128 + signal.SIGTERM  # what a process killed by SIGTERM would report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=SHARED / "data" / "cifar10",
                   help="CIFAR-10 python batches, in DIR/cifar-10-batches-py or DIR "
                        "(default: %(default)s)")
    p.add_argument("--run-name", default="resnet-cifar10",
                   help="names the checkpoint directory (default: %(default)s)")
    p.add_argument("--checkpoint-dir", type=Path, default=None,
                   help=f"where checkpoints go (default: {SHARED}/checkpoints/USER/RUN_NAME: "
                        "each user's own directory on the share)")
    p.add_argument("--keep", type=int, default=3, help="checkpoints to keep (default: 3)")
    p.add_argument("--no-resume", action="store_true",
                   help="start from scratch even if checkpoints exist")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=128, help="per process (default: 128)")
    p.add_argument("--width", type=int, default=32, help="channels of the first stage")
    p.add_argument("--blocks", type=int, default=1, help="residual blocks per stage")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    p.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default: 0.1 for sgd, 0.002 for adamw)")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="default: 5e-4 for sgd, 0.05 for adamw; never applied to "
                        "biases and norm layers")
    p.add_argument("--momentum", type=float, default=0.9, help="sgd only")
    p.add_argument("--schedule", choices=("onecycle", "cosine"), default="onecycle",
                   help="learning-rate schedule, stepped every batch")
    p.add_argument("--no-augment", action="store_true",
                   help="no random crop / flip of training images")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels (slower on GPU)")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--amp", choices=("auto", "on", "off"), default="auto",
                   help="bf16 autocast; auto = on with a GPU")
    p.add_argument("--log-every", type=int, default=50, help="steps between progress lines")
    p.add_argument("--metrics-json", type=Path, default=None,
                   help="final metrics file (default: CHECKPOINT_DIR/metrics.json)")
    p.add_argument("--debug-record-indices", type=Path, default=None, metavar="DIR",
                   help="write each rank's training sample order per epoch to DIR")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "width", "blocks", "keep", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.lr is not None and args.lr <= 0:
        p.error("--lr must be > 0")
    if args.checkpoint_dir is None:
        args.checkpoint_dir = SHARED / "checkpoints" / getpass.getuser() / args.run_name
    if args.metrics_json is None:
        args.metrics_json = args.checkpoint_dir / "metrics.json"
    return args


@dataclass
class StopRequest:
    """Set by SIGTERM/SIGINT; the loop checks it between steps on every rank."""

    signum: int | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:  # asked twice: stop now, without saving
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.signum = signum


@dataclass
class Run:
    """Everything the loop needs, built once."""

    args: argparse.Namespace
    env: distributed.DistEnv
    ctrl: Any
    data: cifar.Cifar
    model: nn.Module          # the DDP wrapper (or the bare model in one process)
    core: nn.Module           # the bare model, for evaluation and checkpoints
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: DistributedSampler
    steps_per_epoch: int
    amp: bool
    channels_last: bool
    store: ckpt.CheckpointStore
    aug_gen: torch.Generator
    history: list[dict[str, Any]] = field(default_factory=list)
    partial: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    resumed_from: dict[str, int] | None = None


def log(env: distributed.DistEnv, msg: str) -> None:
    if env.is_main:
        print(msg, flush=True)


def seed_everything(seed: int, rank: int, deterministic: bool) -> None:
    torch.manual_seed(seed)  # same initial weights on every rank
    random.seed(seed + rank)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    elif torch.cuda.is_available():
        torch.backends.cudnn.benchmark = True


def epoch_generator_seed(seed: int, epoch: int, rank: int) -> int:
    return (seed * 1_000_003 + epoch * 10_007 + rank) % (2**63)


def make_optimizer(args: argparse.Namespace, model: nn.Module) -> torch.optim.Optimizer:
    decay, no_decay = [], []
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
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=peak, total_steps=total_steps, pct_start=0.25)
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)


def rng_state(run: Run) -> dict[str, Any]:
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if run.env.device.type == "cuda" else None,
            "python": random.getstate(),
            "augment": run.aug_gen.get_state()}


def set_rng_state(run: Run, state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and run.env.device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"])
    random.setstate(state["python"])
    run.aug_gen.set_state(state["augment"])


def schedule_signature(run: Run) -> dict[str, Any]:
    a = run.args
    return {"epochs": a.epochs, "steps_per_epoch": run.steps_per_epoch,
            "world_size": run.env.world_size, "batch_size": a.batch_size,
            "width": a.width, "blocks": a.blocks, "optimizer": a.optimizer,
            "schedule": a.schedule}


def save_checkpoint(run: Run, pos: ckpt.Position, partial: list[float] | None = None) -> None:
    """Collective: every rank contributes its RNG state, rank 0 writes.

    `partial` holds the interrupted epoch's summed [loss, correct, samples] so far,
    so that its metrics still cover the whole epoch after a resume."""
    rngs = distributed.gather_to_main(rng_state(run), run.env, group=run.ctrl)
    if not run.env.is_main:
        return
    state = {"model": run.core.state_dict(), "optimizer": run.optimizer.state_dict(),
             "scheduler": run.scheduler.state_dict(), "rng": rngs,
             "signature": schedule_signature(run), "history": run.history,
             "partial_epoch": partial or [0.0, 0.0, 0.0]}
    t0 = time.perf_counter()
    path = run.store.save(state, pos)
    log(run.env, f"checkpoint {path} ({time.perf_counter() - t0:.2f}s)")


def resume(run: Run) -> ckpt.Position:
    """Load the newest complete checkpoint (rank 0 chooses, every rank loads it)."""
    chosen = None
    if run.env.is_main and not run.args.no_resume:
        found = run.store.latest()
        chosen = str(found[0]) if found else None
    chosen = distributed.broadcast_from_main(chosen, run.env, group=run.ctrl)
    if chosen is None:
        return ckpt.Position(0, 0)
    state = run.store.load(Path(chosen))
    sig, now = state["signature"], schedule_signature(run)
    keys = ("epochs", "steps_per_epoch", "width", "blocks", "optimizer", "schedule")
    if any(sig.get(k) != now[k] for k in keys):
        diff = ", ".join(f"{k}: {sig.get(k)} -> {now[k]}" for k in keys if sig.get(k) != now[k])
        raise SystemExit(f"error: checkpoint {chosen} was made with other settings ({diff}); "
                         "rerun with the same settings, or use another --run-name "
                         "(or --no-resume) to start a new run")
    run.core.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.history = list(state["history"])
    pos = ckpt.Position(int(state["epoch"]), int(state["step"]))
    if pos.step and run.env.is_main:  # rank 0 carries the whole job's partial sums
        run.partial = [float(v) for v in state.get("partial_epoch", [0.0, 0.0, 0.0])]
    rngs = state["rng"]
    if len(rngs) == run.env.world_size and sig["batch_size"] == now["batch_size"]:
        set_rng_state(run, rngs[run.env.rank])
    elif pos.step:
        log(run.env, "world size or batch size changed: restarting the interrupted epoch")
        pos = ckpt.Position(pos.epoch, 0)
    run.resumed_from = {"epoch": pos.epoch, "step": pos.step}
    log(run.env, f"resumed from {chosen}: epoch {pos.epoch}, step {pos.step}")
    return pos


def autocast(run: Run):
    if not run.amp:
        return contextlib.nullcontext()
    return torch.autocast(device_type=run.env.device.type, dtype=torch.bfloat16)


def to_input(run: Run, x_uint8: torch.Tensor, train: bool) -> torch.Tensor:
    x = cifar.normalize(x_uint8, run.env.device)
    if train and not run.args.no_augment:
        x = cifar.augment(x, run.aug_gen)
    return x.contiguous(memory_format=torch.channels_last) if run.channels_last else x


def evaluate(run: Run) -> tuple[float, float]:
    """Each rank scores a disjoint shard of the test set; counts are summed over ranks."""
    run.core.eval()
    d, env = run.data, run.env
    shard = cifar.eval_shard(len(d.test_y), env.rank, env.world_size)
    loss_sum = torch.zeros((), dtype=torch.float64, device=env.device)
    correct = torch.zeros((), dtype=torch.int64, device=env.device)
    with torch.no_grad(), autocast(run):
        for idx in cifar.batches(shard, run.args.batch_size * 2):
            x = to_input(run, d.test_x[idx], train=False)
            y = d.test_y[idx].to(env.device, non_blocking=True)
            out = run.core(x).float()
            loss_sum += nn.functional.cross_entropy(out, y, reduction="sum")
            correct += (out.argmax(1) == y).sum()
    total_loss, total_correct, n = distributed.sum_across(
        [loss_sum.item(), float(correct.item()), float(len(shard))], env)
    return total_loss / n, total_correct / n


def record_indices(run: Run, epoch: int, indices: list[int]) -> None:
    out = run.args.debug_record_indices
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{run.env.rank}-epoch{epoch}.json").write_text(json.dumps(indices))


def train_epoch(run: Run, epoch: int, start_step: int, stop: StopRequest) -> dict[str, Any] | None:
    """One epoch; returns its metrics, or None when a stop was requested (after saving)."""
    env, d, args = run.env, run.data, run.args
    run.model.train()
    run.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
    indices = list(run.sampler)
    if args.debug_record_indices is not None:
        record_indices(run, epoch, indices)
    if start_step == 0:
        run.aug_gen.manual_seed(epoch_generator_seed(args.seed, epoch, env.rank))
    carried, run.partial = run.partial, [0.0, 0.0, 0.0]  # sums from before a mid-epoch stop
    loss_sum = torch.zeros((), dtype=torch.float64, device=env.device)
    correct = torch.zeros((), dtype=torch.int64, device=env.device)
    seen = 0
    t0 = time.perf_counter()
    for step, idx in enumerate(cifar.batches(indices, args.batch_size)):
        if step < start_step:
            continue
        x = to_input(run, d.train_x[idx], train=True)
        y = d.train_y[idx].to(env.device, non_blocking=True)
        with autocast(run):
            out = run.model(x)
            loss = nn.functional.cross_entropy(out.float(), y)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        run.optimizer.step()
        run.scheduler.step()
        loss_sum += loss.detach().double() * len(idx)
        correct += (out.detach().argmax(1) == y).sum()
        seen += len(idx)
        if env.is_main and (step + 1) % args.log_every == 0:
            print(f"epoch {epoch + 1} step {step + 1}/{run.steps_per_epoch} "
                  f"loss {loss.item():.4f} lr {run.scheduler.get_last_lr()[0]:.5f}", flush=True)
        if distributed.any_rank(stop.signum is not None, env, run.ctrl):
            log(env, f"stop requested: saving epoch {epoch + 1} at step {step + 1}")
            sums = distributed.sum_across(
                [loss_sum.item() + carried[0], correct.item() + carried[1], seen + carried[2]], env)
            save_checkpoint(run, ckpt.Position(epoch, step + 1), partial=sums)
            return None
    loss_total, correct_total, seen_total, seen_now = distributed.sum_across(
        [loss_sum.item() + carried[0], correct.item() + carried[1], seen + carried[2], seen], env)
    elapsed = time.perf_counter() - t0
    return {"epoch": epoch + 1, "train_loss": loss_total / max(seen_total, 1),
            "train_acc": correct_total / max(seen_total, 1),
            "samples_per_s": seen_now / elapsed, "train_time_s": elapsed,
            "lr": run.scheduler.get_last_lr()[0]}


def write_json_atomic(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def build(args: argparse.Namespace, env: distributed.DistEnv, data: cifar.Cifar) -> Run:
    core = build_model(args.width, args.blocks, num_classes=len(data.classes)).to(env.device)
    channels_last = env.device.type == "cuda"
    if channels_last:
        core = core.to(memory_format=torch.channels_last)
    model: nn.Module = core
    if env.distributed:
        model = DDP(core, device_ids=[env.local_rank] if env.device.type == "cuda" else None)
    sampler = DistributedSampler(range(len(data.train_y)), num_replicas=env.world_size,
                                 rank=env.rank, shuffle=True, seed=args.seed, drop_last=True)
    steps = math.ceil(len(sampler) / args.batch_size)
    optimizer = make_optimizer(args, core)
    scheduler = make_scheduler(args, optimizer, total_steps=steps * args.epochs)
    amp = args.amp == "on" or (args.amp == "auto" and env.device.type == "cuda")
    store = ckpt.CheckpointStore(args.checkpoint_dir, keep=args.keep,
                                 log=lambda m: log(env, m))
    return Run(args=args, env=env, ctrl=distributed.control_group(env), data=data,
               model=model, core=core, optimizer=optimizer, scheduler=scheduler,
               sampler=sampler, steps_per_epoch=steps, amp=amp, channels_last=channels_last,
               store=store, aug_gen=torch.Generator())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cifar.find_root(args.data_dir)  # before any process group: fail fast and clearly
    except cifar.DataMissingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = StopRequest()
    env = distributed.setup(args.backend, args.device)
    try:
        return _run(args, env, stop)
    finally:
        distributed.teardown(env)


def _run(args: argparse.Namespace, env: distributed.DistEnv, stop: StopRequest) -> int:
    seed_everything(args.seed, env.rank, args.deterministic)
    data = cifar.load_cifar(args.data_dir)
    run = build(args, env, data)
    if env.is_main:
        removed = run.store.remove_stale_temps()
        if removed:
            log(env, f"removed {removed} unfinished checkpoint file(s) of a killed writer")
    # Every rank reports in once, so a log shows the whole world joined (and from where).
    print(f"rank {env.rank}/{env.world_size} (local rank {env.local_rank}) on "
          f"{socket.gethostname()}, device {env.device}", flush=True)
    log(env, f"world size {env.world_size}, backend {env.backend or 'none'}, device "
             f"{env.device.type}, bf16 {run.amp}; {len(data.train_y)} train / "
             f"{len(data.test_y)} test images, {len(data.classes)} classes; model "
             f"{parameter_count(run.core) / 1e6:.2f} M parameters")
    pos = resume(run)
    stop.install()  # from here on a stop request is answered with a checkpoint
    for epoch in range(pos.epoch, args.epochs):
        metrics = train_epoch(run, epoch, pos.step if epoch == pos.epoch else 0, stop)
        if metrics is None:
            return EXIT_STOPPED
        metrics["test_loss"], metrics["test_acc"] = evaluate(run)
        run.history.append(metrics)
        log(env, "epoch {epoch}/{total} train loss {train_loss:.4f} acc {train_acc:.4f} | "
                 "test loss {test_loss:.4f} acc {test_acc:.4f} | {samples_per_s:.0f} samples/s "
                 "| lr {lr:.5f}".format(total=args.epochs, **metrics))
        save_checkpoint(run, ckpt.Position(epoch + 1, 0))
        if distributed.any_rank(stop.signum is not None, env, run.ctrl):
            return EXIT_STOPPED
    if env.is_main:
        final = dict(run.history[-1]) if run.history else {}
        final.update(world_size=env.world_size, backend=env.backend, device=env.device.type,
                     epochs=args.epochs, resumed_from=run.resumed_from)
        write_json_atomic(args.metrics_json, {"final": final, "history": run.history})
        print("FINAL_METRICS " + json.dumps(final), flush=True)
    # Leave together: a rank that tears its process group down while another is still
    # finishing makes gloo abort that one (seen as SIGABRT after a successful run).
    distributed.barrier(env)
    return 0


if __name__ == "__main__":
    # The orchestrator starts this through its worker runner (orchestrator/run_worker.py),
    # which ends a finished worker cleanly: torch's gloo teardown cannot fail it.
    sys.exit(main())
