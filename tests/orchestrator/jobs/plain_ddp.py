"""A plain DDP training script, as a user writes it: it knows nothing of clustertrain and
prints nothing while it trains (one line at the start and one at the end).

A small MLP on random data, gloo (or CLUSTERTRAIN_BACKEND), one thread per rank, STEPS
steps of BATCH samples each; --eval-every K runs an evaluation forward every K steps;
--slow-rank R --slow-s S: rank R does S seconds more of its own work per step (a sleep);
--fsdp: the model sharded with FSDP's fully_shard (each layer, then the whole) instead.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--width", type=int, default=512)
parser.add_argument("--layers", type=int, default=4)
parser.add_argument("--eval-every", type=int, default=0)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slow-s", type=float, default=0.0)
parser.add_argument("--fsdp", action="store_true")
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
dist.init_process_group(os.environ.get("CLUSTERTRAIN_BACKEND", "gloo"))
rank = dist.get_rank()
layers = []
for _ in range(args.layers):
    layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
net = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10))
model: torch.nn.Module
if args.fsdp:
    from torch.distributed.fsdp import fully_shard
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    model = net
else:
    model = DDP(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(args.batch, args.width)
y = torch.randint(0, 10, (args.batch,))
print(f"rank {rank} training", flush=True)
for step in range(args.steps):
    if rank == args.slow_rank:
        time.sleep(args.slow_s)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if args.eval_every and step % args.eval_every == 0:
        model.eval()
        with torch.no_grad():
            model(x)
        model.train()
print(f"rank {rank} done: loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
