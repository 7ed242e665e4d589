"""Test job: every rank joins the process group (and says which attempt it is, from
CLUSTERTRAIN_RECOVERY); the ranks on node --fail-node (-1: every node) then fail --how:
exit with code 3, raise an exception, die of SIGKILL (as the OOM killer kills), or of
SIGSEGV (a bad pointer in a C extension: reading address 0), or save a checkpoint of
--fill-mib MiB into --fill-dir, the temporary directory by default (fill: on a nearly full
disk, torch.save fails). The others
keep running (not in a collective) until they are stopped."""
import argparse
import ctypes
import os
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fail-node", type=int, default=1)
parser.add_argument("--after", type=float, default=2.0)
parser.add_argument("--how", choices=("exit", "raise", "kill", "segv", "fill"), default="exit")
parser.add_argument("--fill-dir", default=tempfile.gettempdir())
parser.add_argument("--fill-mib", type=int, default=16)
args = parser.parse_args()


def crash_in_c() -> None:
    ctypes.string_at(0)   # SIGSEGV



dist.init_process_group(os.environ.get("CLUSTERTRAIN_BACKEND", "gloo"))
node = int(os.environ["CLUSTERTRAIN_NODE_RANK"])
print(f"rank {dist.get_rank()} on node {node} joined (recovery "
      f"{os.environ.get('CLUSTERTRAIN_RECOVERY', '-')})", flush=True)
time.sleep(args.after)
if args.fail_node in (node, -1):
    print(f"rank {dist.get_rank()}: simulated failure on node {node} ({args.how})", flush=True)
    if args.how == "raise":
        raise RuntimeError("the script's own error")
    if args.how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if args.how == "segv":
        crash_in_c()
    if args.how == "fill":
        torch.save({"weights": torch.zeros(args.fill_mib << 18)},   # 4-byte floats
                   os.path.join(args.fill_dir, f"ckpt-{dist.get_rank()}.pt"))
    sys.exit(3)
while True:
    time.sleep(0.5)
