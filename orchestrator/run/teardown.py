"""Stop one run's processes on one node: job-scoped, never by name.

The job's torchrun wrote its PID (= its process group id) to ~/.clustertrain/jobs/<run>/pgid
of the job user. The stop script (run as that user) first checks that the group still
belongs to that run (a member's environment carries CLUSTERTRAIN_RUN_ID=<run>), so a
stale record never signals an unrelated process that reuses the PID. It collects that
group and every descendant of it (torchrun starts its workers in sessions of their own),
sends SIGTERM to the group so that torchrun stops its workers cleanly, and after the
grace period SIGKILLs whatever of that set is left.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .. import defaults
from ..cluster import nodelib, ssh
from ..node.protocol import JOBS_DIR


@dataclass(frozen=True)
class StopResult:
    node: str
    found: bool            # the node had a job record for this run
    was_running: bool      # some of its processes were alive when the stop began
    killed: list[int]      # PIDs that needed SIGKILL after the grace period
    left: list[int]        # PIDs still alive afterwards (should be empty)
    user: str = ""         # the user the stop ran as on the node
    stale: bool = False    # the recorded group is another process now: nothing signalled


def stop_job(conn: ssh.Connection, python: str, run_id: str,
             grace: float = defaults.GRACE) -> StopResult:
    # The node package's stop (node/stop.py): one implementation of "stop this run's
    # process tree" for the supervisor, train and stop.
    result = nodelib.call(conn, python, "stop", JOBS_DIR, run_id, str(grace),
                          timeout=grace + 30)
    lines = result.stdout.strip().splitlines()
    if result.exit_code != 0 or not lines:
        raise RuntimeError(f"{conn.name}: stop script failed: {result.stderr.strip()[-300:]}")
    data = json.loads(lines[-1])
    return StopResult(conn.name, data["found"], bool(data.get("initial")),
                      data.get("killed", []), data.get("left", []), data.get("user", ""),
                      bool(data.get("stale")))
