"""Test job: a correct DDP run whose ranks on --abort-node die of SIGABRT after their
script has finished, as gloo's teardown now and then makes them.

Test double: the worker runner's last call, os._exit, is replaced on those ranks by one
that waits (the other ranks finish meanwhile) and then aborts the process."""
import argparse
import os
import time
from typing import NoReturn

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--abort-node", type=int, default=1)
args = parser.parse_args()

dist.init_process_group(os.environ.get("CLUSTERTRAIN_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank}/{world} sum {t.item():.0f}", flush=True)
dist.barrier()
dist.destroy_process_group()
if int(os.environ["CLUSTERTRAIN_NODE_RANK"]) == args.abort_node:
    def abort_in_teardown(status: int) -> NoReturn:
        time.sleep(5)
        os.abort()
    os._exit = abort_in_teardown
