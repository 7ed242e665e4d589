"""Test job for how a worker ends (the worker runner, orchestrator/node/worker.py).

It lives in a subdirectory and imports its neighbour, so it runs only if sys.path[0] is
the script's own directory. --end: return normally, sys.exit(3), or raise. --unclosed:
write a file in the run's job directory and never close it."""
import argparse
import os
import sys

import finish_helper  # type: ignore[import-not-found]  # next to this script, not in cwd

parser = argparse.ArgumentParser()
parser.add_argument("--end", choices=("return", "exit3", "raise"), default="return")
parser.add_argument("--unclosed", action="store_true")
args = parser.parse_args()
rank = int(os.environ["RANK"])
print(f"rank {rank} {finish_helper.GREETING} argv {sys.argv[1:]} name {__name__}", flush=True)
if args.unclosed:
    path = os.path.expanduser(f"~/.clustertrain/jobs/{os.environ['CLUSTERTRAIN_RUN_ID']}/"
                              f"unclosed-rank{rank}.txt")
    unclosed = open(path, "w")  # noqa: SIM115 - never closed, on purpose
    unclosed.write(f"rank {rank} wrote this and never closed it\n")
if args.end == "exit3":
    sys.exit(3)
if args.end == "raise":
    raise RuntimeError(f"simulated failure on rank {rank}")
