"""Samples/s of the training step, and what DistributedDataParallel costs at world size 1.

    python bench/ddp_overhead.py [--device auto|cpu|cuda] [--steps 10] [--repeats 3]

The same model (train/model.py, default width), the same optimizer step and the
same input are timed twice: as a bare module, and wrapped in DDP in a
one-process group (gloo on CPU, NCCL on a GPU). On one process DDP still
registers its autograd hooks, fills gradient buckets and runs an all-reduce per
bucket, so the ratio of the two is its fixed overhead. The two variants alternate,
with the order flipped every round, and medians are reported, so that drifting
load on a shared machine affects both alike. Results go to
bench/results/ddp_overhead.json.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "train"))
from model import build_model, parameter_count  # noqa: E402

REFERENCE = "PyTorch's own DDP benchmark: +3% to +6% overhead at world size 1"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--blocks", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=None,
                   help="default: 64 on CPU, 512 on a GPU")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per round (default: 6 on CPU, 100 on a GPU)")
    p.add_argument("--repeats", type=int, default=4, help="rounds of both variants")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "ddp_overhead.json")
    return p.parse_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Step:
    """One training step of `model` on a fixed batch (SGD, cross-entropy, optional bf16)."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, amp: bool) -> None:
        self.model, self.x, self.y, self.amp = model, x, y, amp
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def __call__(self) -> None:
        with torch.autocast(self.x.device.type, dtype=torch.bfloat16, enabled=self.amp):
            loss = nn.functional.cross_entropy(self.model(self.x).float(), self.y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Step, n: int, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync(device)
    return time.perf_counter() - t0


def main() -> int:
    args = parse_args()
    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    batch = args.batch_size or (512 if cuda else 64)
    steps = args.steps or (100 if cuda else 6)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1, device_id=device if cuda else None)
    torch.manual_seed(0)
    base = build_model(args.width, args.blocks, num_classes=10).to(device)
    if cuda:
        base = base.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    x = torch.randn(batch, 3, 32, 32, device=device)
    if cuda:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=device)
    plain = Step(copy.deepcopy(base), x, y, amp=cuda)
    ddp = Step(DDP(copy.deepcopy(base), device_ids=[0] if cuda else None), x, y, amp=cuda)
    variants = {"plain": plain, "ddp": ddp}

    for step in variants.values():
        time_steps(step, args.warmup, device)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.repeats):
        order = ("plain", "ddp") if r % 2 == 0 else ("ddp", "plain")
        for name in order:
            times[name].append(time_steps(variants[name], steps, device))
    dist.destroy_process_group()

    per_step = {k: statistics.median(v) / steps for k, v in times.items()}
    ratios = [d / p for d, p in zip(times["ddp"], times["plain"], strict=True)]
    result: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if cuda else
        f"CPU {platform.processor() or platform.machine()} x{os.cpu_count()}",
        "torch": torch.__version__, "backend": backend, "threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],  # other work on the machine at the time
        "config": {"model": f"ResNet width {args.width}, {args.blocks} block(s)/stage, "
                            f"{parameter_count(base) / 1e6:.2f} M parameters",
                   "batch_size": batch, "steps_per_round": steps, "rounds": args.repeats,
                   "warmup_steps": args.warmup, "bf16_channels_last": cuda},
        "samples_per_s": {k: batch / t for k, t in per_step.items()},
        "ms_per_step": {k: 1000 * t for k, t in per_step.items()},
        "ddp_overhead_pct": 100 * (per_step["ddp"] / per_step["plain"] - 1),
        "ddp_overhead_pct_per_round": [100 * (r - 1) for r in ratios],
        "reference": REFERENCE,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['device']}, torch {result['torch']}, {backend}, batch {batch}")
    print(f"{'variant':<8} {'samples/s':>10} {'ms/step':>9}")
    for k in variants:
        print(f"{k:<8} {result['samples_per_s'][k]:>10.1f} {result['ms_per_step'][k]:>9.2f}")
    rounds = ", ".join(f"{v:+.1f}%" for v in result["ddp_overhead_pct_per_round"])
    print(f"DDP overhead at world size 1: {result['ddp_overhead_pct']:+.1f}% "
          f"(rounds: {rounds}); reference: {REFERENCE}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
