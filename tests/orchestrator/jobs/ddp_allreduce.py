"""Test job: a real DDP step on every rank, then an all_reduce whose result is checked.

Prints one line per rank: `rank R/W host H sum S ok`; with --tick, `tick N` each second
of --sleep too.
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--sleep", type=float, default=0.0, help="seconds to keep running")
parser.add_argument("--tick", action="store_true", help="a numbered line each second")
args = parser.parse_args()

dist.init_process_group(os.environ.get("CLUSTERTRAIN_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
expected = world * (world + 1) / 2
print(f"rank {rank}/{world} host {socket.gethostname()} sum {t.item():.0f} "
      f"{'ok' if t.item() == expected else 'WRONG'}", flush=True)
start = time.monotonic()
ticks = 0
while time.monotonic() < start + args.sleep:
    if args.tick and time.monotonic() >= start + ticks:
        print(f"tick {ticks}", flush=True)
        ticks += 1
    time.sleep(0.2)
dist.barrier()
dist.destroy_process_group()
