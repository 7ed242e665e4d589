"""A failed run's last words are its failing rank's own exception (run/job.py, read by
record/ends.py's rank_error), after torchrun's: torchrun_failure.log is what a real
`torchrun --nproc_per_node 1 --redirects 3 -m orchestrator.node.worker script.py` printed
for a script that raised (the rank's stdout and stderr, then torchrun's console), prefixed
as a node's log is."""

from __future__ import annotations

import io
import time
from pathlib import Path

from orchestrator.node.protocol import End
from orchestrator.record.ends import RankError, rank_error
from orchestrator.record.rundir import RunDir
from orchestrator.run.conclude import NodeOutcome
from orchestrator.run.job import Following, Job, NodeExited
from orchestrator.run.scheduler import SshScheduler

RECORDED = (Path(__file__).parent / "torchrun_failure.log").read_text().splitlines()
EXCEPTION = "FileNotFoundError: no such dataset: /data/missing"


def test_the_failing_ranks_exception_is_read_from_the_log_not_torchruns() -> None:
    found = rank_error(RECORDED)
    assert found == RankError("n0", 0, (
        '  File "/tmp/h/d_fail.py", line 5, in load',
        '    raise FileNotFoundError(f"no such dataset: {path}")', EXCEPTION))
    # torchrun's own traceback (ChildFailedError) is no rank's; a rank's output without a
    # traceback (exit code 3 from sys.exit) has no exception to show.
    assert rank_error([x for x in RECORDED if "/rank0 |" not in x]) is None
    # Of two ranks, the one torchrun's report names; a later traceback of the same rank
    # (an exception while handling it) is its last word.
    other = ["n0/rank1 | Traceback (most recent call last):", 'n0/rank1 |   File "x.py", line 1',
             "n0/rank1 | RuntimeError: Connection reset by peer"]
    named, last = rank_error(other + RECORDED), rank_error(RECORDED[:9] + other)
    assert named is not None and named.rank == 0   # the report's root cause: rank 0
    assert last is not None and last.rank == 1     # no report: the last traceback


def test_a_failed_runs_last_lines_are_the_ranks_exception_after_torchruns(
        tmp_path: Path) -> None:
    run = RunDir(tmp_path / "runs", "r1")
    run.path.mkdir(parents=True)
    out = io.StringIO()
    job = Job(run, [], SshScheduler({}), out=out)
    job.outcomes["n0"] = NodeOutcome("n0")
    with open(run.log("n0"), "a") as log:
        job._emit(log, job.outcomes["n0"], RECORDED)
    f = Following(attached=True, running={"n0"}, next_look=time.monotonic() + 60)
    job._on_exit(f, NodeExited("n0", 1, End.EXITED, ""))
    job._result(f, time.time())
    said = out.getvalue().splitlines()
    assert "ChildFailedError" in out.getvalue()          # torchrun's words are shown ...
    assert said[-4:] == [                                  # ... and the rank's come last
        "[clustertrain] n0: rank 0 failed; the end of its traceback:",
        '    n0/rank0 |   File "/tmp/h/d_fail.py", line 5, in load',
        '    n0/rank0 |     raise FileNotFoundError(f"no such dataset: {path}")',
        f"    n0/rank0 | {EXCEPTION}"], said[-12:]
