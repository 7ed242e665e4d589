"""The node's torchrun (orchestrator/node/torchrun.py): real torchrun, two nodes' agents on
this machine, the second held up between its arrival at torch's exit barrier and its wait
there (as a loaded host holds an agent up). torch's own torchrun then ends the run that
succeeded with the store's stack on the second node; the node's does not."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.node import torchrun

REPO = Path(__file__).resolve().parents[3]
ERROR = "Error waiting on exit barrier"
# A Python traceback, or a C++ stack as torch logs it (the soak's invariant's reading).
STACK = re.compile(r"Traceback \(most recent call last\)|frame #\d+:|Exception raised from ")

# Loaded before torch by every process that has this directory on its path: with
# HOLD_UP_AFTER_ARRIVAL set, an agent's arrival at a store barrier is followed by a pause.
SITECUSTOMIZE = """
import os
if os.environ.get("HOLD_UP_AFTER_ARRIVAL"):
    import time
    import torch.distributed.elastic.utils.store as store
    arrive = store._barrier_nonblocking
    def held_up(*args, **kwargs):
        key = arrive(*args, **kwargs)
        time.sleep(float(os.environ["HOLD_UP_AFTER_ARRIVAL"]))
        return key
    store._barrier_nonblocking = held_up
"""
# Node 0's worker ends at once, node 1's a second later: node 1's agent arrives last.
SCRIPT = """
import os, time
time.sleep(0 if os.environ["GROUP_RANK"] == "0" else 1.0)
print("rank", os.environ["RANK"], "done", flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(launcher: list[str], tmp_path: Path) -> list[subprocess.CompletedProcess]:
    (tmp_path / "site").mkdir(exist_ok=True)
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{REPO}",
               "OMP_NUM_THREADS": "1"}
        if rank == 1:
            env["HOLD_UP_AFTER_ARRIVAL"] = "3"
        procs.append(subprocess.Popen(
            [*launcher, "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
             "--master-addr", "127.0.0.1", "--master-port", port, "--monitor-interval", "0.1",
             str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=120), p.communicate()[0])
            for p in procs]


def test_torchs_own_torchrun_shows_the_store_stack_under_a_run_that_succeeded(
        tmp_path: Path) -> None:
    """The race this module removes, as torch has it: the case the next test holds."""
    ends = _two_nodes([sys.executable, "-m", "torch.distributed.run"], tmp_path)
    assert [e.returncode for e in ends] == [0, 0], [e.stdout[-2000:] for e in ends]
    assert ERROR not in ends[0].stdout
    assert ERROR in ends[1].stdout and "Traceback" in ends[1].stdout, ends[1].stdout[-3000:]


def test_the_nodes_torchrun_ends_a_run_that_succeeded_without_a_stack(tmp_path: Path) -> None:
    ends = _two_nodes([sys.executable, "-m", "orchestrator.node", "torchrun"], tmp_path)
    for node, end in enumerate(ends):
        assert end.returncode == 0, end.stdout[-3000:]
        assert f"rank {node} done" in end.stdout
        assert ERROR not in end.stdout and not STACK.search(end.stdout), end.stdout[-3000:]


class Store:
    """A store's add(), as the agents call it, with every call kept."""

    def __init__(self, count: int = 0) -> None:
        self.count, self.calls = count, list[tuple[str, int]]()

    def add(self, key: str, amount: int) -> int:
        self.calls.append((key, amount))
        self.count += amount
        return self.count


def agent(store: object, agents: int, rank: int, backend: str = "static") -> object:
    handler = type("Handler", (), {"get_backend": lambda self: backend})()
    spec = type("Spec", (), {"rdzv_handler": handler})()
    group = type("Group", (), {"group_world_size": agents, "group_rank": rank, "spec": spec})()
    return type("Agent", (), {"_store": store, "_worker_group": group})()


def test_an_agent_that_holds_no_store_counts_itself_out_and_never_speaks_to_it_again(
        ) -> None:
    """Its count is its last word to the store: a look at the count after it could meet a
    store that is gone, and torch's C++ logs that look's stack, caught or not (the soak
    saw 34 to 68 lines of it under runs that succeeded)."""
    store = Store()
    torchrun.leave_together(agent(store, 3, 2), linger=60)
    assert store.calls == [(torchrun.LEFT_KEY, 1)]


def test_the_agent_that_holds_the_store_leaves_once_the_others_counted_out() -> None:
    store = Store(count=1)   # one of the two others has counted out
    def other_counts_out() -> None:
        import time
        time.sleep(0.5)
        store.count += 1
    import threading
    threading.Thread(target=other_counts_out).start()
    torchrun.leave_together(agent(store, 3, 0), linger=60)
    assert store.count == 2 and all(amount == 0 for _, amount in store.calls)


def test_a_host_that_waits_in_vain_leaves_after_the_linger() -> None:
    import time
    store = Store()
    started = time.monotonic()
    torchrun.leave_together(agent(store, 2, 0), linger=0.5)
    assert 0.4 < time.monotonic() - started < 5


@pytest.mark.parametrize(("agents", "backend"), [(1, "static"), (3, "c10d")])
def test_one_agent_or_another_rendezvous_is_left_as_torch_has_it(agents: int,
                                                                 backend: str) -> None:
    store = Store()
    torchrun.leave_together(agent(store, agents, 0, backend), linger=60)
    assert store.calls == []


def test_an_agent_class_without_the_barrier_is_left_as_it_is() -> None:
    class Other:
        pass

    assert torchrun.wait_for_all(Other) is False
    assert not hasattr(Other, "_exit_barrier")


def test_the_command_runs_the_scripts_own_python(tmp_path: Path) -> None:
    entry = tmp_path / "node.py"
    entry.write_text("")
    script = tmp_path / "torchrun"
    script.write_text("#!/opt/env/bin/python3.11\nimport sys\n"
                      "from torch.distributed.run import main\nsys.exit(main())\n")
    assert torchrun.command([str(script), "--nnodes", "2", "job.py"], str(entry)) == [
        "/opt/env/bin/python3.11", str(entry), "torchrun", "--nnodes", "2", "job.py"]


@pytest.mark.parametrize("first", [
    "#!/bin/sh\n", "#!/usr/bin/env python3\n", "import sys\n",
    "#!/opt/env/bin/python3\nimport runpy\n",   # a python script, not torch's torchrun
])
def test_a_torchrun_that_is_not_torchs_own_with_a_python_of_its_own_runs_as_it_is(
        tmp_path: Path, first: str) -> None:
    entry = tmp_path / "node.py"
    entry.write_text("")
    script = tmp_path / "torchrun"
    script.write_text(first + ("" if "runpy" in first
                               else "from torch.distributed.run import main\n"))
    argv = [str(script), "--nnodes", "2", "job.py"]
    assert torchrun.command(argv, str(entry)) == argv
    assert torchrun.command(argv, str(tmp_path / "none.py")) == argv   # no node.py there
