"""Slurm's accounting in `usage` (orchestrator/node/sacct.py): node- and GPU-hours per user
from sacct's allocations, clipped to the window (a real sacct on the sandbox:
tests/orchestrator/slurm/test_queue_sandbox.py)."""

from __future__ import annotations

from datetime import datetime

from orchestrator.node.sacct import FIELDS, command, parse


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# The first line was captured from the Slurm sandbox's sacct (22.05, 2026-11-29, `srun -N1
# --gres=gpu:1 sleep 1` as alice); the others are written by hand in its format: a 2-node
# job with 4 GPUs that began before the window, one still running (End Unknown), one that
# never started, and bob's job without GPUs.
SACCT = """1|alice|1|billing=1,cpu=1,gres/gpu=1,node=1|2026-11-29T11:41:44|2026-11-29T11:41:45
7|alice|2|billing=4,cpu=4,gres/gpu=4,node=2|2026-11-28T23:00:00|2026-11-29T02:00:00
8|alice|1|billing=2,cpu=2,gres/gpu=2,node=1|2026-11-29T11:00:00|Unknown
9|alice|1|billing=2,cpu=2,gres/gpu=2,node=1|Unknown|Unknown
10|bob|1|billing=1,cpu=1,node=1|2026-11-29T10:00:00|2026-11-29T10:30:00
"""


def test_hours_per_user_are_each_jobs_time_in_the_window_times_its_nodes_and_gpus() -> None:
    since, now = at("2026-11-29T00:00:00"), at("2026-11-29T12:00:00")
    users = parse(SACCT, since, now)
    # alice: 1 s x (1 node, 1 GPU); 2 h x (2 nodes, 4 GPUs) inside the window; 1 h so far
    # x (1 node, 2 GPUs); the job that never started counts for nothing
    assert users["alice"] == {"jobs": 3, "node_hours": round(1 / 3600 + 4 + 1, 3),
                              "gpu_hours": round(1 / 3600 + 8 + 2, 3)}
    assert users["bob"] == {"jobs": 1, "node_hours": 0.5, "gpu_hours": 0.0}


def test_the_command_asks_for_the_allocations_of_the_window() -> None:
    argv = command(at("2026-11-01T00:00:00"), everyone=False)
    assert argv[:4] == ["sacct", "-X", "-P", "-n"]
    assert argv[argv.index("-S") + 1] == "2026-11-01T00:00:00"
    assert argv[argv.index("-o") + 1] == ",".join(FIELDS) and "-a" not in argv
    assert command(0.0, everyone=True)[-1] == "-a"
