"""Test job for sweeps: every rank joins the process group, waits --seconds, and rank 0
prints FINAL_METRICS with a loss made from the trial's parameters (--lr, --width), so that
the sweep's ranking is known in advance: the lower --width and the nearer --lr to 0.05,
the better. --fail-width W: a trial of that width fails."""
import argparse
import json
import os
import sys
import time

import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--width", type=int, required=True)
parser.add_argument("--seconds", type=float, default=1.0)
parser.add_argument("--fail-width", type=int, default=None)
args = parser.parse_args()

dist.init_process_group(os.environ.get("CLUSTERTRAIN_BACKEND", "gloo"))
steps = max(1, round(args.seconds / 0.25))
for step in range(steps):   # a loss falling from the trial's own height, once a step
    time.sleep(args.seconds / steps)
    loss = (1 + args.width / 10) * (1 - step / (2 * steps))
    print(f"##clustertrain beat step_s={args.seconds / steps:.3f} samples=8 step={step} "
          f"loss={loss:.4f}", flush=True)
if args.width == args.fail_width:
    print(f"width {args.width}: failing as asked", flush=True)
    sys.exit(3)
dist.barrier()
if dist.get_rank() == 0:
    loss = abs(args.lr - 0.05) + args.width / 100
    print("FINAL_METRICS " + json.dumps({"test_loss": round(loss, 6), "width": args.width}),
          flush=True)
dist.destroy_process_group()
