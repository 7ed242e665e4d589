"""What measuring a DDP script's step times costs, paired block by block (issue 49, item 6).

    python bench/steptime_paired.py [--ranks 2] [--pairs 40] [--block 200] [--width 128]

bench/steptime_cost.py compares whole runs, whose samples/s wander by 10 % from one run
to the next on a shared 2-core machine: more than the cost it looks for. Here RANKS gloo
ranks run one DDP job (one thread each) and switch the measuring on and off every BLOCK
steps, all ranks together (a barrier between blocks), in the order on-off, off-on, ...:
"off" is DDP's own forward and the reducer's default timer sampling (every 100th
iteration), "on" is the forward as the worker runner wraps it (node/steptime.py:
`instrument`, beats printed to nowhere, the reducer's figures as often as the reads need
them, DDP's logging data read at most five times a second). Each pair of neighbouring blocks gives a
ratio of their step times; the median ratio over PAIRS pairs is the cost, with the
spread of the ratios beside it. Results go to bench/results/steptime_paired.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

JOB = """\
import json, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from orchestrator.node import steptime
pairs, block, width, batch = (int(a) for a in sys.argv[1:5])
torch.set_num_threads(1)
torch.manual_seed(0)
dist.init_process_group("gloo")
plain = DDP.forward
meter = steptime.StepMeter()
steptime.instrument(DDP, meter, out=lambda line: None)
measured = DDP.forward
model = DDP(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(batch, width), torch.randint(0, 10, (batch,))

def steps(n):
    for _ in range(n):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

def timed(on):
    DDP.forward = measured if on else plain
    # The wrapper sets the rate when its meter changes it: here, what it set (on), or
    # DDP's default (off).
    model._set_ddp_runtime_logging_sample_rate(meter.rate if on else 100)
    steps(5)          # the switch settles
    dist.barrier()
    t0 = time.perf_counter()
    steps(block)
    return (time.perf_counter() - t0) / block

steps(50)
out = []
for i in range(pairs):
    order = (True, False) if i % 2 == 0 else (False, True)
    got = {on: timed(on) for on in order}
    out.append({"on": got[True], "off": got[False]})
if dist.get_rank() == 0:
    print("RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--pairs", type=int, default=40)
    p.add_argument("--block", type=int, default=200, help="steps per block")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--out", type=Path,
                   default=REPO / "bench" / "results" / "steptime_paired.json")
    args = p.parse_args()
    port = str(free_port())
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.py"
        job.write_text(JOB)
        procs = []
        for rank in range(args.ranks):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
                   "WORLD_SIZE": str(args.ranks), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": port, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
            procs.append(subprocess.Popen(
                [sys.executable, str(job), str(args.pairs), str(args.block), str(args.width),
                 str(args.batch)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))
        outs = [proc.communicate(timeout=3600) for proc in procs]
    found = [x for x in outs[0][0].splitlines() if x.startswith("RESULT ")]
    if not found:
        raise SystemExit(f"rank 0 said no result: {outs[0][1][-2000:]}")
    line = found[0]
    pairs = json.loads(line[len("RESULT "):])
    ratios = sorted(b["on"] / b["off"] for b in pairs)
    cost = statistics.median(ratios) - 1
    q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
    step_ms = statistics.median(b["off"] for b in pairs) * 1e3
    summary = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
               "python": platform.python_version(),
               "args": {k: str(v) for k, v in vars(args).items()},
               "median_step_ms_off": round(step_ms, 4), "cost_pct": round(cost * 100, 2),
               "ratio_quartiles": [round(q1, 4), round(q3, 4)], "pairs": pairs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{len(pairs)} pairs of {args.block}-step blocks, {args.ranks} ranks, a step "
          f"{step_ms:.3f} ms: measuring costs {cost * 100:+.2f} % (median ratio; quartiles "
          f"{(q1 - 1) * 100:+.2f} % .. {(q3 - 1) * 100:+.2f} %)")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
