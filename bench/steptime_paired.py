"""What measuring a DDP script's step times costs, step by step (issue 49, item 6).

    python bench/steptime_paired.py [--ranks 1] [--steps 20000] [--width 128] [--batch 32]

Whole runs, plain against measured, wander by 10 % in samples/s from one run to the next
on a shared 2-core machine, and so do blocks of a few hundred steps within one run: more
than the cost looked for. Here each of RANKS gloo ranks (one thread each) holds two
copies of one model, each wrapped in DDP: one of torch's own class, as it ships, and one
of the class as the worker runner instruments it (node/steptime.py: `instrument`, beats
printed to nowhere, the reducer's figures as often as the reads need them, DDP's logging
data read at most five times a second). They train in turn, a step each, in the order
plain-measured then measured-plain, on the same batch; each step is timed by itself, so
a drift of the machine's pace hits both copies alike.

The cost in samples/s is the measured copy's total time over the plain one's, less one.
A pair in which a step took twice the median or more is left out (the machine's
interruptions, as many in either copy; the meter's slowest forward adds tens of
microseconds); the cost over all pairs is said beside it, and so is the median of the
pairs' ratios, which leaves out what the meter does only now and then (the clocked
forwards, the reads). The 95 % interval comes from resampling the pairs. The measured
copy's meter takes the other copy's step for part of its own, so it sets the reducer's
rate at about half what a job of its pace alone would get: twice as many clocked
forwards, an overestimate of that part. Results go to bench/results/steptime_paired.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
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
steps, width, batch = (int(a) for a in sys.argv[1:4])
torch.set_num_threads(1)
torch.manual_seed(0)
dist.init_process_group("gloo")

class Plain(DDP):   # torch's forward, as it ships
    pass

Plain.forward = DDP.forward
meter = steptime.StepMeter()
steptime.instrument(DDP, meter, out=lambda line: None)

def copy(cls):
    torch.manual_seed(0)
    model = cls(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                    torch.nn.Linear(width, 10)))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)

copies = {"off": copy(Plain), "on": copy(DDP)}
x, y = torch.randn(batch, width), torch.randint(0, 10, (batch,))
clock = time.perf_counter

def step(name):
    model, opt = copies[name]
    t0 = clock()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return clock() - t0

for _ in range(500):
    step("off"), step("on")
dist.barrier()
out = []
for i in range(steps // 2):
    order = ("off", "on") if i % 2 == 0 else ("on", "off")
    got = {name: step(name) for name in order}
    out.append([got["on"], got["off"]])
if dist.get_rank() == 0:
    print("RESULT " + json.dumps({"pairs": out, "rate": meter.rate}), flush=True)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--steps", type=int, default=20000, help="steps of each copy")
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
                [sys.executable, str(job), str(args.steps * 2), str(args.width),
                 str(args.batch)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))
        outs = [proc.communicate(timeout=3600) for proc in procs]
    found = [x for x in outs[0][0].splitlines() if x.startswith("RESULT ")]
    if not found:
        raise SystemExit(f"rank 0 said no result: {outs[0][1][-2000:]}")
    result = json.loads(found[0][len("RESULT "):])
    pairs = result["pairs"]
    typical = statistics.median(t for pair in pairs for t in pair)
    kept = [(on, off) for on, off in pairs if max(on, off) < 2 * typical]
    ratios = sorted(on / off for on, off in pairs)
    median = statistics.median(ratios) - 1
    q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]

    def total(sample: list[tuple[float, float]]) -> float:
        return sum(on for on, _ in sample) / sum(off for _, off in sample) - 1

    cost, everything = total(kept), total([(on, off) for on, off in pairs])
    # The long steps of each copy: how many, and the time they took beyond a typical step.
    long = {name: [t - typical for pair in pairs if (t := pair[i]) >= 2 * typical]
            for i, name in enumerate(("on", "off"))}
    draw = random.Random(0)
    again = sorted(total(draw.choices(kept, k=len(kept))) for _ in range(200))
    lo, hi = again[5], again[194]
    off_us = statistics.mean(off for _, off in kept) * 1e6
    on_us = statistics.mean(on for on, _ in kept) * 1e6
    summary = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
               "python": platform.python_version(),
               "args": {k: str(v) for k, v in vars(args).items()},
               "mean_step_us_off": round(off_us, 2), "mean_step_us_on": round(on_us, 2),
               "cost_pct": round(cost * 100, 3),
               "cost_pct_95": [round(lo * 100, 3), round(hi * 100, 3)],
               "cost_pct_all_pairs": round(everything * 100, 3),
               "median_ratio_pct": round(median * 100, 3),
               "ratio_quartiles": [round(q1, 4), round(q3, 4)],
               "long_steps": {name: {"count": len(v), "beyond_s": round(sum(v), 4)}
                              for name, v in long.items()},
               "rate": result["rate"], "pairs": len(pairs),
               "pairs_left_out": len(pairs) - len(kept)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{len(pairs)} pairs of steps, {args.ranks} rank(s), a step {off_us:.1f} us plain, "
          f"{on_us:.1f} us measured: measuring costs {cost * 100:+.2f} % of samples/s "
          f"(95 % interval {lo * 100:+.2f} % .. {hi * 100:+.2f} %; all pairs "
          f"{everything * 100:+.2f} %, {len(pairs) - len(kept)} left out; median ratio "
          f"{median * 100:+.2f} %, quartiles {(q1 - 1) * 100:+.2f} % .. {(q3 - 1) * 100:+.2f} %)")
    print("steps of twice the median or more: " + ", ".join(
        f"{name} {len(v)} ({sum(v):.3f} s beyond the median)" for name, v in long.items()))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
