"""How workers end, on the real sandbox nodes: every worker starts through the worker
runner (orchestrator/node/worker.py), so a correct gloo script that calls
destroy_process_group() and leaves normally is never failed by torch's teardown; the
script's exit code, traceback, files and imports are its own; a rank that dies after its
script finished is named as such, and the run counts as finished."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ...cluster import ProvisionedCluster as Sandbox
from .test_train_sandbox import JOBS, Train

# The timeout covers the session fixture too: preparing nodes takes minutes on a busy machine.
pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1500)]
# Two runs: the rate (torch's teardown aborting 1 run in 50 without the runner, none in 50
# with it) is bench/teardown_abort.py's; this test is the behaviour, not the statistic.
RUNS = 2
MARKER = "[clustertrain] rank {rank} finished: exit code {code}"
# A Python traceback, or a C++ stack as torch logs it (bench/soak/invariants.py's reading).
STACK = re.compile(r"Traceback \(most recent call last\)|frame #\d+:|Exception raised from ")


def assert_run_gone(sandbox: Sandbox, run_id: str, nodes=("node0", "node1", "node2")) -> None:
    """No process of RUN_ID is left on NODES (others' jobs on the same nodes may go on)."""
    left = {n: sandbox.run_processes(n, run_id) for n in nodes}
    assert not any(left.values()), f"processes of run {run_id} left behind: {left}"


def test_a_correct_gloo_script_succeeds_every_time(sandbox_cluster: Sandbox,
                                                    tmp_path: Path) -> None:
    # ddp_allreduce.py ends as users' scripts do: barrier, destroy_process_group(), return.
    # Before the runner, such runs now and then failed with SIGABRT after the result.
    failures = []
    for i in range(RUNS):
        t = Train(sandbox_cluster, tmp_path / f"run{i}", "--nodes", "3", "ddp_allreduce.py",
                  "--", "--steps", "1")
        code = t.finish()
        if code != 0:
            failures.append(f"run {i}: exit {code}\n{t.text[-2000:]}\n{t.stderr[-2000:]}")
            continue
        summary = t.summary()
        assert summary["status"] == "succeeded" and summary["training_completed"] is True
        assert summary["exit_codes"] == {"node0": 0, "node1": 0, "node2": 0}
        assert summary["rank_exit_codes"] == {f"node{r}": {str(r): 0} for r in range(3)}
        for rank in range(3):
            assert f"node{rank}/rank{rank} | rank {rank}/3 host node{rank} sum 6 ok" in t.text
            assert f"node{rank}/rank{rank} | {MARKER.format(rank=rank, code=0)}" in t.text
        assert "terminate called" not in t.text
        # torch's agents leave the end together (node/torchrun.py): no store stack
        assert not STACK.search(t.text) and "exit barrier" not in t.text, t.text[-3000:]
        assert_run_gone(sandbox_cluster, summary["run_id"])
    assert not failures, f"{len(failures)} of {RUNS} runs failed:\n" + "\n".join(failures)


def test_a_rank_that_aborts_after_finishing_is_named_and_the_run_finished(
        sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    t = Train(sandbox_cluster, tmp_path, "--nodes", "3", "abort_after_finish.py", "--",
              "--abort-node", "1")
    code = t.finish()
    summary = t.summary()
    assert code == 0, t.text[-3000:] + t.stderr
    assert "rank 1 on node1 finished, then aborted in torch's teardown" in t.stderr
    assert "the training completed on every rank" in t.stderr
    assert summary["status"] == "succeeded" and summary["training_completed"] is True
    assert summary["first_failed"] is None
    assert summary["exit_codes"]["node1"] != 0  # torchrun's own word stays on record
    # torchrun on the other nodes waits for node1's at its exit barrier: those were
    # stopped when node1 failed, after their ranks had finished.
    assert summary["after_finish"] == {
        "node1": ["rank 1 on node1 finished, then aborted in torch's teardown"],
        **{n: [f"every rank on {n} had finished when the node was stopped"]
           for n in ("node0", "node2") if summary["exit_codes"][n] != 0}}
    assert summary["rank_exit_codes"] == {f"node{r}": {str(r): 0} for r in range(3)}
    assert_run_gone(sandbox_cluster, summary["run_id"])


def test_the_scripts_exit_code_is_reported(sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "finish/finish.py", "--",
              "--end", "exit3")
    code = t.finish()
    assert code != 0
    summary = t.summary()
    failed = summary["first_failed"]
    rank = int(failed[-1])  # one rank per node: node N runs rank N
    assert summary["status"] == "failed" and summary["training_completed"] is False
    assert summary["rank_exit_codes"][failed] == {str(rank): 3}
    assert f"{failed} exited with code 1 (rank {rank} exited with code 3) first" in t.stderr
    assert f"{failed}/rank{rank} | {MARKER.format(rank=rank, code=3)}" in t.text


def test_an_uncaught_exception_fails_the_run_with_its_traceback(sandbox_cluster: Sandbox,
                                                                 tmp_path: Path) -> None:
    t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "finish/finish.py", "--",
              "--end", "raise")
    assert t.finish() != 0
    summary = t.summary()
    failed = summary["first_failed"]
    rank = int(failed[-1])
    assert summary["status"] == "failed" and summary["rank_exit_codes"][failed] == {
        str(rank): 1}
    log = Path(summary["nodes"][rank]["log"]).read_text()
    worker = [line.split(" | ", 1)[1] for line in log.splitlines()
              if line.startswith(f"{failed}/rank{rank} | ")]
    at = worker.index("Traceback (most recent call last):")
    # The rank's standard output and error reach the log through two pipes: a line the
    # script printed earlier may come between the traceback's lines.
    frame = next(line for line in worker[at + 1:] if line.startswith('  File "'))
    assert frame.startswith('  File "/home/alice/.clustertrain/code/'), worker[at:]
    raised_at = next(i for i, line in enumerate(
        (JOBS / "finish" / "finish.py").read_text().splitlines(), 1) if "raise Runtime" in line)
    assert frame.endswith(f'/finish/finish.py", line {raised_at}, in <module>'), worker[at:]
    assert f"RuntimeError: simulated failure on rank {rank}" in worker
    assert not any("node/worker.py" in line for line in worker)  # no frame of the runner
    assert f"RuntimeError: simulated failure on rank {rank}" in t.stderr  # last lines


def test_files_never_closed_are_on_disk_and_imports_are_the_scripts(
        sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "finish/finish.py", "--",
              "--unclosed")
    assert t.finish() == 0, t.text[-3000:] + t.stderr
    summary = t.summary()
    for rank in (0, 1):
        assert (f"node{rank}/rank{rank} | rank {rank} helper imported from the script's "
                f"directory argv ['--unclosed'] name __main__") in t.text
        path = f"/home/alice/.clustertrain/jobs/{summary['run_id']}/unclosed-rank{rank}.txt"
        assert sandbox_cluster.exec(f"node{rank}", "cat", path).stdout == (
            f"rank {rank} wrote this and never closed it\n")


def test_a_module_runs_with_dash_m(sandbox_cluster: Sandbox, tmp_path: Path) -> None:
    t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "-m", "pkgjob.main", "--",
              "--greeting", "hi")
    assert t.finish() == 0, t.text[-3000:] + t.stderr
    for rank in (0, 1):
        assert (f"node{rank}/rank{rank} | rank {rank} module pkgjob.main name __main__ util 42 "
                "argv ['--greeting', 'hi']") in t.text
    summary = t.summary()
    assert summary["module"] is True and summary["script"] == "pkgjob.main"
    assert summary["command"]["node0"].endswith(
        "/node.py worker -m pkgjob.main --greeting hi")


def test_no_clean_exit_runs_the_script_itself(sandbox_cluster: Sandbox,
                                              tmp_path: Path) -> None:
    t = Train(sandbox_cluster, tmp_path, "--nodes", "2", "--no-clean-exit", "finish/finish.py")
    assert t.finish() == 0, t.text[-3000:] + t.stderr
    summary = t.summary()
    assert summary["clean_exit"] is False and summary["training_completed"] is True
    assert summary["command"]["node1"].endswith("torchrun-logs finish/finish.py")
    assert "[clustertrain] rank" not in t.text
    assert "rank 1 helper imported from the script's directory" in t.text
