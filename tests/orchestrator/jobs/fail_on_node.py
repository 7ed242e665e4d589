"""Test job: every rank joins the process group; the ranks on node --fail-node then exit
with code 3, the others keep running (not in a collective) until they are stopped."""
import argparse
import os
import sys
import time

import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fail-node", type=int, default=1)
parser.add_argument("--after", type=float, default=2.0)
args = parser.parse_args()

dist.init_process_group(os.environ.get("CLUSTERTRAIN_BACKEND", "gloo"))
node = int(os.environ["CLUSTERTRAIN_NODE_RANK"])
print(f"rank {dist.get_rank()} on node {node} joined", flush=True)
time.sleep(args.after)
if node == args.fail_node:
    print(f"rank {dist.get_rank()}: simulated failure on node {node}", flush=True)
    sys.exit(3)
while True:
    time.sleep(0.5)
