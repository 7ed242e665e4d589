"""torchrun as a run's supervisor starts it: `PYTHON node.py torchrun ARGS...` is torch's
own torchrun (torch.distributed.run) with ARGS, and one thing changed: no agent leaves the
end of a run while another one may still need the rendezvous store.

Why. At the end of a run every node's torchrun (its agent) waits at an exit barrier kept in
the rendezvous store, which one agent hosts (node rank 0's, with the static rendezvous).
Once the last agent has arrived, the host may leave, and its store with it, while another
agent's wait is still on its way; that agent then logs "Error waiting on exit barrier" and
the store's C++ stack ("Failed to recv, got 0 bytes"), some 40 lines, under a run that
succeeded (pytorch/pytorch#69520; more likely on a loaded host, where an agent is held up
between its arrival and its wait). Here, with the static rendezvous (the launch's), every
other agent, once through torch's barrier, counts itself out on the store, its last word to
it, and the host waits, at most LINGER seconds, until all have: the host is the last to
go. (Every agent waiting for all to count out would not do: the host could then leave
while another still looks at the count, and torch's C++ logs the stack of that failed
look, caught or not; the soak saw it.)

The change wraps torch's SimpleElasticAgent._exit_barrier, which is not a public API: with
a torch that lacks it, torchrun runs unchanged. `command` gives the supervisor the command
line: the torchrun script's own Python runs this module, where its first line names one.

Standard library only until torch is imported, in the job's Python.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any

LEFT_KEY = "clustertrain/agents-left"   # in the agents' store: how many have passed
LINGER = 15.0   # seconds an agent waits at most for the others to count themselves out
POLL = 0.05     # seconds between two looks at the count
VERB = "torchrun"
ENTRY_POINT = b"from torch.distributed.run import main"   # what pip and conda write
_WRAPPED = "_clustertrain_waits_for_all"


def interpreter(script: str) -> str | None:
    """The Python that SCRIPT, torch's torchrun console script, names on its first line
    (#!), or None: not such a script (a wrapper of a site's own, a test's double), or a
    first line that is more than one Python's path (conda writes `#!/bin/sh` with an
    `exec` for a path too long for #!)."""
    try:
        with open(script, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return None
    first, _, rest = head.partition(b"\n")
    if not first.startswith(b"#!") or ENTRY_POINT not in rest:
        return None
    words = first[2:].decode(errors="replace").split()
    if len(words) != 1 or not os.path.basename(words[0]).startswith("python"):
        return None
    return words[0]


def command(argv: list[str], entry: str) -> list[str]:
    """torchrun's command line ARGV as this module runs it (ENTRY: this package's node.py),
    or ARGV unchanged where there is no ENTRY or torchrun's script names no Python."""
    python = interpreter(argv[0]) if argv and os.path.isfile(entry) else None
    return [python, entry, VERB, *argv[1:]] if python else list(argv)


def leave_together(agent: Any, linger: float = LINGER) -> None:
    """AGENT has passed torch's exit barrier. With the static rendezvous: every other
    agent counts itself out on the store, its last word to it, and leaves; the one that
    hosts the store (node rank 0) waits until all have (LINGER seconds at most), so that
    no agent ever speaks to a store that is gone (torch's C++ logs its stack then, even
    for a call whose error is caught). Another rendezvous is left as torch has it.
    Nothing is raised."""
    try:
        store = agent._store
        group = agent._worker_group
        agents, rank = int(group.group_world_size), int(group.group_rank)
        static = group.spec.rdzv_handler.get_backend() == "static"
    except (AttributeError, TypeError, ValueError):
        return
    if store is None or agents <= 1 or not static:
        return
    try:
        if rank != 0:
            store.add(LEFT_KEY, 1)
            return
        deadline = time.monotonic() + linger
        while store.add(LEFT_KEY, 0) < agents - 1 and time.monotonic() < deadline:
            time.sleep(POLL)
    except Exception:  # noqa: BLE001 - the store failed: torch's end goes on as it would
        pass


def wait_for_all(agent_class: type, linger: float = LINGER) -> bool:
    """Make AGENT_CLASS's exit barrier end with leave_together; whether it could (False:
    the class has no _exit_barrier, a torch this was not made for)."""
    barrier = getattr(agent_class, "_exit_barrier", None)
    if barrier is None or not callable(barrier):
        return False
    if getattr(barrier, _WRAPPED, False):
        return True

    @functools.wraps(barrier)
    def exit_barrier(self: Any) -> None:
        barrier(self)
        leave_together(self, linger)

    setattr(exit_barrier, _WRAPPED, True)
    agent_class._exit_barrier = exit_barrier  # type: ignore[attr-defined]
    return True


def main(argv: list[str]) -> int:
    """torchrun with ARGV (its own arguments), as its console script runs it."""
    from torch.distributed import run  # the job's torch
    try:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    except ImportError:
        pass
    else:
        wait_for_all(SimpleElasticAgent)
    sys.argv = ["torchrun", *argv]
    result = run.main()
    return result if isinstance(result, int) else 0
