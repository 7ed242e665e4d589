"""Run records for the report's tests, made by the project's own code from recorded data:
the timeline by feeding `Progress` beat lines (one a second per rank, a straggler among
them), the hang by analysing the py-spy dumps of a real hung gloo job (hang_dumps/stall),
the doctor by analysing a real doctor result with a throttled node (doctor_results/). Only
the beat lines are made up: their step times are what a run with one slow node prints."""

from __future__ import annotations

import json
import random
from pathlib import Path

from orchestrator.diagnosis.hang import RankId, analyze_stacks, read_pyspy_dump
from orchestrator.record.progress import Progress
from orchestrator.record.rundir import RunDir, iso
from orchestrator.record.summary import Summary
from orchestrator.run.conclude import write_summary
from orchestrator.workloads.doctor_run import analyse as doctor_analyse

HERE = Path(__file__).parents[1]
DUMPS = HERE / "hang_dumps"
DOCTOR = HERE / "doctor_results"
START = 1_790_000_000.0   # 2026-09-21, the recorded run's start on the wall clock


def _beats(nodes: list[str], seconds: int, slow: str | None, ranks_per_node: int = 1,
           every: int = 1, start: float = START) -> Progress:
    """PROGRESS fed a beat per rank every EVERY seconds for SECONDS; SLOW's first rank
    takes 1.5 x the others' step time."""
    rng = random.Random(7)
    progress = Progress(now=0.0, wall=start)
    for second in range(0, seconds, every):
        loss = 2.3 * (0.2 + 0.8 * (1 - second / seconds))
        for i, node in enumerate(nodes):
            for local in range(ranks_per_node):
                step_s = 0.100 * (1 + rng.uniform(-0.03, 0.03))
                if node == slow and local == 0:
                    step_s *= 1.5
                progress.line(node, i * ranks_per_node + local,
                              f"##clustertrain beat step_s={step_s:.6f} samples=32 "
                              f"step={second} loss={loss:.4f}", now=float(second))
        if second % 600 == 0:
            progress.stragglers(now=float(second))   # as a follower looks, now and then
    return progress


def write_run(root: Path, run_id: str, nodes: list[str], seconds: int, *,
              slow: str | None = None, hang: bool = False, doctor: str | None = None,
              every: int = 1, log_lines: int = 40, start: float = START,
              summary: dict | None = None) -> RunDir:
    """A finished run's record under ROOT, as `train` leaves it (with its report);
    SUMMARY: more of its summary (recoveries, ...)."""
    run = RunDir(root, run_id)
    progress = _beats(nodes, seconds, slow, every=every, start=start)
    summary_progress = progress.to_json()
    # The inventory it ran from is not on this machine: its nodes cannot be asked.
    run.create({"run_id": run_id, "inventory": str(root / "elsewhere" / "inventory.yml"),
                "nodes": nodes, "users": {n: "alice" for n in nodes},
                "script": "train.py", "script_args": ["--epochs", "30"],
                "master": {"addr": "10.89.0.10", "port": 29500}, "code_revision": "f4f2945",
                "fingerprint": {"python": "3.11.2", "packages": {"torch": "2.13.0"},
                                "sha256": "ab12cd34ef56" * 5}})
    run.append_timeline(progress.take_points())
    for n in nodes:
        run.log(n).write_text("".join(f"{n}/rank0 | epoch 1 step {i} loss 0.5\n"
                                      for i in range(log_lines))
                              + (f'{n}/rank0 | FINAL_METRICS {{"test_acc": 0.71, '
                                 f'"world_size": {len(nodes)}}}\n' if n == nodes[0] else ""))
    extra: dict = {"step_times": summary_progress["nodes"],
                   "stragglers": summary_progress["stragglers"]}
    status, first_failed = "succeeded", None
    if hang:
        ranks = [RankId(**r) for r in json.loads((DUMPS / "stall" / "ranks.json").read_text())]
        analysis = analyze_stacks(read_pyspy_dump(DUMPS / "stall" / f"rank{r.rank}.json", r)
                                  for r in ranks)
        extra["hang"] = {"detected_at": iso(start + seconds - 30), "quiet_s": 30.0,
                         "found_by": "the nodes", "verdict": analysis.verdict,
                         "dumps": str(run.path / "hang"), **analysis.to_json()}
        status = "hung"
    if doctor:
        result = json.loads((DOCTOR / doctor).read_text())
        run.write_json("doctor.json", doctor_analyse(run_id, result, nodes).to_json())
    write_summary(run, Summary.from_json({**run.info(), "status": status, "start": iso(start),
                       "end": iso(start + seconds), "duration_s": float(seconds),
                       "nodes": [{"name": n, "node_rank": i, "nproc": 1,
                                  "exit_code": 0 if status == "succeeded" else 1,
                                  "end_reason": "exited" if status == "succeeded" else "hung"}
                                 for i, n in enumerate(nodes)],
                       "first_failed": first_failed, **extra, **(summary or {})}))
    return run
