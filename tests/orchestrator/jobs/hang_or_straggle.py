"""Test job for hang detection, `diagnose` and stragglers (gloo, one rank per node).

    steps:    STEPS steps of own work (a CPU matmul loop, timed), an all_reduce and a
              pause each, one beat per step (`##clustertrain beat step_s=... samples=8`)
    stall:    two healthy steps, then rank --rank sleeps before its all_reduce: the others
              wait in all_reduce, for ever
    mismatch: two healthy steps, then rank 0 broadcasts while the others all_reduce

--timeout S: the process group's timeout (gloo's default is 30 minutes): a stall then
ends in the waiting ranks' collective timeout.
"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=("steps", "stall", "mismatch"))
parser.add_argument("--rank", type=int, default=1, help="the rank that stalls")
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--work", type=int, default=40, help="matmuls per step")
parser.add_argument("--pause", type=float, default=0.0, help="seconds of sleep per step")
parser.add_argument("--timeout", type=float, help="the process group's timeout, seconds")
args = parser.parse_args()

torch.set_num_threads(1)
dist.init_process_group(os.environ.get("CLUSTERTRAIN_BACKEND", "gloo"),
                        timeout=datetime.timedelta(seconds=args.timeout) if args.timeout
                        else None)
rank = dist.get_rank()
a = torch.randn(128, 128)
print(f"rank {rank} started", flush=True)


def own_work() -> float:
    t0 = time.perf_counter()
    for _ in range(args.work):
        torch.mm(a, a)
    return time.perf_counter() - t0


def step(i: int) -> None:
    own = own_work()
    dist.all_reduce(torch.ones(1))
    print(f"##clustertrain beat step_s={own:.6f} samples=8", flush=True)
    time.sleep(args.pause)


def stuck_before_all_reduce() -> None:
    time.sleep(3600)  # the rank whose data never comes


def waiting_in_all_reduce() -> None:
    dist.all_reduce(torch.ones(1))


def sending_a_broadcast() -> None:
    dist.broadcast(torch.ones(1), src=0)


for i in range(args.steps if args.mode == "steps" else 2):
    step(i)
print(f"rank {rank} did its steps", flush=True)
if args.mode == "stall":
    if rank == args.rank:
        stuck_before_all_reduce()
    waiting_in_all_reduce()
elif args.mode == "mismatch":
    sending_a_broadcast() if rank == 0 else waiting_in_all_reduce()
dist.barrier()
dist.destroy_process_group()
