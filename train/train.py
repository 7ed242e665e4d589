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
import getpass
import json
import os
import random
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch

import checkpoint as ckpt
import data as cifar
import distributed
from model import parameter_count
from trainer import Trainer, log

SHARED = Path("/mnt/cluster")
EXIT_STOPPED = 128 + signal.SIGTERM  # what a process killed by SIGTERM would report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=SHARED / "data" / "cifar10",
                   help="CIFAR-10 python batches, in DIR/cifar-10-batches-py or DIR "
                        "(default: %(default)s)")
    p.add_argument("--run-name", default=os.environ.get("SWEEP_TRIAL") or "resnet-cifar10",
                   help="names the checkpoint directory (default: a sweep's trial, "
                        "SWEEP_TRIAL, else resnet-cifar10)")
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


def seed_everything(seed: int, rank: int, deterministic: bool) -> None:
    torch.manual_seed(seed)  # same initial weights on every rank
    random.seed(seed + rank)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    elif torch.cuda.is_available():
        torch.backends.cudnn.benchmark = True


def write_json_atomic(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cifar.find_root(args.data_dir)  # before any process group: fail fast and clearly
    except cifar.DataMissingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env = distributed.setup(args.backend, args.device)
    try:
        return _run(args, env)
    except ckpt.RestoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        distributed.teardown(env)


def _run(args: argparse.Namespace, env: distributed.DistEnv) -> int:
    seed_everything(args.seed, env.rank, args.deterministic)
    data = cifar.load_cifar(args.data_dir)
    trainer = Trainer(args, env, data)
    try:
        return _train(trainer)
    finally:
        trainer.close()


def checkpointer_for(trainer: Trainer) -> ckpt.Checkpointer:
    env = trainer.env
    store = ckpt.CheckpointStore(trainer.args.checkpoint_dir, keep=trainer.args.keep,
                                 log=lambda m: log(env, m))
    return ckpt.Checkpointer(
        store, main=env.is_main,
        share=lambda chosen: distributed.broadcast_from_main(chosen, env, group=trainer.ctrl))


def _save(trainer: Trainer, checkpointer: ckpt.Checkpointer) -> None:
    t0 = time.perf_counter()
    path = checkpointer.save(trainer)  # collective: every rank's random streams go in
    if path is not None:
        log(trainer.env, f"checkpoint {path} ({time.perf_counter() - t0:.2f}s)")


def _train(trainer: Trainer) -> int:
    args, env, data = trainer.args, trainer.env, trainer.data
    checkpointer = checkpointer_for(trainer)
    if env.is_main:
        removed = checkpointer.store.remove_stale_temps()
        if removed:
            log(env, f"removed {removed} unfinished checkpoint file(s) of a killed writer")
    # Every rank reports in once, so a log shows the whole world joined (and from where).
    print(f"rank {env.rank}/{env.world_size} (local rank {env.local_rank}) on "
          f"{socket.gethostname()}, device {env.device}", flush=True)
    log(env, f"world size {env.world_size}, backend {env.backend or 'none'}, device "
             f"{env.device.type}, bf16 {trainer.amp}; {len(data.train_y)} train / "
             f"{len(data.test_y)} test images, {len(data.classes)} classes; model "
             f"{parameter_count(trainer.core) / 1e6:.2f} M parameters")
    if not args.no_resume:
        t0 = time.perf_counter()
        resumed = checkpointer.restore(trainer)  # one checkpoint, read once by each rank
        if resumed is not None:
            pos = trainer.position
            log(env, f"resumed from {resumed} in {time.perf_counter() - t0:.2f} s: epoch "
                     f"{pos.epoch}, step {pos.step} (global step {trainer.global_step})")
    stop = trainer.stop
    stop.install()  # from here on a stop request is answered with a checkpoint
    while trainer.position.epoch < args.epochs:
        metrics = trainer.train_epoch(lambda: stop.signum is not None)
        if metrics is None:
            _save(trainer, checkpointer)  # mid-epoch
            return EXIT_STOPPED
        metrics["test_loss"], metrics["test_acc"] = trainer.evaluate()
        trainer.history.append(metrics)
        log(env, "epoch {epoch}/{total} train loss {train_loss:.4f} acc {train_acc:.4f} | "
                 "test loss {test_loss:.4f} acc {test_acc:.4f} | {samples_per_s:.0f} samples/s "
                 "| lr {lr:.5f}".format(total=args.epochs, **metrics))
        _save(trainer, checkpointer)
        if distributed.any_rank(stop.signum is not None, env, trainer.ctrl):
            return EXIT_STOPPED
    if env.is_main:
        final = dict(trainer.history[-1]) if trainer.history else {}
        final.update(world_size=env.world_size, backend=env.backend, device=env.device.type,
                     epochs=args.epochs, resumed_from=trainer.resumed_from)
        write_json_atomic(args.metrics_json, {"final": final, "history": trainer.history})
        print("FINAL_METRICS " + json.dumps(final), flush=True)
    # Leave together: a rank that tears its process group down while another is still
    # finishing makes gloo abort that one (seen as SIGABRT after a successful run).
    distributed.barrier(env)
    return 0


if __name__ == "__main__":
    # The orchestrator starts this through its worker runner (orchestrator/run_worker.py),
    # which ends a finished worker cleanly: torch's gloo teardown cannot fail it.
    sys.exit(main())
