"""Which scheduler a run goes through: the one choice, made from the run."""

from __future__ import annotations

from orchestrator.run.scheduler import SlurmScheduler, SshScheduler, scheduler_for, slurm_job_of


def test_a_run_that_holds_a_slurm_job_goes_through_slurm_else_over_ssh() -> None:
    queued = {"run_id": "r1", "slurm": {"job_id": "17", "nodes": ["node0"]}}
    plain = {"run_id": "r2", "slurm": None}
    assert slurm_job_of(queued) == "17"
    assert slurm_job_of(plain) is None and slurm_job_of({"run_id": "r3"}) is None
    chosen = scheduler_for(slurm_job_of(queued))
    assert isinstance(chosen, SlurmScheduler) and chosen.job == "17"
    assert type(scheduler_for(slurm_job_of(plain))) is SshScheduler
