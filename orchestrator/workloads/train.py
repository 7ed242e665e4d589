"""`train`: a run (run/lifecycle.py), after doctor on its nodes when the spec asks for it
(`--doctor`: doctor.py, a run of its own)."""

from __future__ import annotations

from ..run.lifecycle import choose_nodes, run_training
from ..run.spec import RunSpec
from .doctor_run import doctor_first


def train(spec: RunSpec, dry_run: bool = False) -> int:
    """The run's exit status. Its nodes are chosen and checked first (a bad --queue or
    spare is refused before doctor runs), then doctor with --doctor, then the run."""
    nodes = choose_nodes(spec)
    if spec.doctor:
        doctor_first(spec, nodes.cluster, dry_run)
    return run_training(spec, dry_run, nodes)
