"""A small gloo job that hangs on purpose, in one of several ways, for record.py.

    torchrun --standalone --nproc-per-node 4 orchestrator/run_worker.py hang_job.py MODE DIR

MODE is one of MODES. Every rank runs two healthy steps (all_reduce), then reaches the
mode's hang point. Just before it, each rank writes DIR/ready_rank{R}.json (its rank and
pid). A daemon thread waits for DIR/trigger and then writes the rank's flight-recorder
dumps with torch's own writers: fr_rank{R}.pkl (_dump_fr_trace, pickle) and
fr_rank{R}.json (_dump_fr_trace_json). The main thread is blocked in a collective or in a
sleep by then, neither of which holds the GIL.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json  # type: ignore[attr-defined]

MODES = ("stall", "mismatch", "tie", "healthy", "async_wait")
FOREVER = 3600.0


def stuck_in_data_loading() -> None:
    time.sleep(FOREVER)  # a rank whose data never arrives


def between_steps() -> None:
    time.sleep(FOREVER)  # every rank idles here: nobody waits for anybody


def train_step(t: torch.Tensor) -> None:
    dist.all_reduce(t)


def sync_weights(t: torch.Tensor) -> None:
    dist.broadcast(t, src=0)


def overlapped_step(t: torch.Tensor) -> None:
    work = dist.all_reduce(t, async_op=True)
    work.wait()


def _flight_recorder_dumper(out: Path, rank: int) -> None:
    while not (out / "trigger").exists():
        time.sleep(0.1)
    (out / f"fr_rank{rank}.pkl").write_bytes(_dump_fr_trace())
    (out / f"fr_rank{rank}.json").write_bytes(_dump_fr_trace_json())


def _ready(out: Path, rank: int) -> None:
    info = {"rank": rank, "pid": os.getpid(), "local_rank": int(os.environ["LOCAL_RANK"])}
    (out / f"ready_rank{rank}.json").write_text(json.dumps(info))


def hang(mode: str, rank: int, t: torch.Tensor, out: Path) -> None:
    _ready(out, rank)
    if mode == "stall":
        if rank == 2:
            stuck_in_data_loading()
        train_step(t)
    elif mode in ("mismatch", "tie"):
        if rank < (1 if mode == "mismatch" else 2):
            sync_weights(t)
        else:
            train_step(t)
    elif mode == "healthy":
        between_steps()
    elif mode == "async_wait":
        if rank == 1:
            stuck_in_data_loading()
        overlapped_step(t)


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    threading.Thread(target=_flight_recorder_dumper, args=(out, rank), daemon=True).start()
    t = torch.ones(8)
    for _ in range(2):
        train_step(t)
    hang(mode, rank, t, out)


if __name__ == "__main__":
    main()
