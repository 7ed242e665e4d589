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
import shlex
from dataclasses import dataclass

from . import ssh
from .command import JOBS_SUBDIR, NODE_STATE_DIR

DEFAULT_GRACE = 5.0

STOP_SCRIPT = r'''
import json, os, signal, sys, time
import getpass
run_id, grace = sys.argv[2], float(sys.argv[3])
job = os.path.join(os.path.expanduser("~"), sys.argv[1], run_id)
me = getpass.getuser()
try:
    pgid = int(open(os.path.join(job, "pgid")).read().split()[0])
except (OSError, ValueError, IndexError):
    print(json.dumps({"found": False, "user": me, "killed": [], "left": []}))
    sys.exit(0)
marker = f"CLUSTERTRAIN_RUN_ID={run_id}".encode()

def belongs(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return marker in fh.read().split(b"\0")
    except OSError:
        return False

def table():
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            procs[int(d)] = (fields[0], int(fields[1]), int(fields[2]))  # state, ppid, pgrp
    return procs

seen = set()
def members():
    procs = table()
    live = {p for p, (st, _, pg) in procs.items() if pg == pgid and st != "Z"}
    grew = True
    while grew:
        grew = False
        for p, (st, pp, _) in procs.items():
            if pp in live and p not in live and st != "Z":
                live.add(p)
                grew = True
    # Descendants that outlived their parent were re-parented; remember all we saw.
    live |= {p for p in seen if p in procs and procs[p][0] != "Z"}
    seen.update(live)
    return live

start = members()
if start and not any(belongs(p) for p in start):
    # The PID was reused by something that is not this run: signal nothing.
    print(json.dumps({"found": True, "user": me, "pgid": pgid, "initial": [],
                      "killed": [], "left": [], "stale": True}))
    sys.exit(0)
try:
    os.killpg(pgid, signal.SIGTERM)
except ProcessLookupError:
    pass
deadline = time.monotonic() + grace
while members() and time.monotonic() < deadline:
    time.sleep(0.1)
killed = sorted(members())
for p in killed:
    try:
        os.kill(p, signal.SIGKILL)
    except ProcessLookupError:
        pass
# A killed process needs a moment to exit on a busy node; wait for it (bounded).
deadline = time.monotonic() + 5
while members() and time.monotonic() < deadline:
    time.sleep(0.1)
open(os.path.join(job, "stopped"), "w").write(str(time.time()))
print(json.dumps({"found": True, "user": me, "pgid": pgid, "initial": sorted(start),
                  "killed": killed, "left": sorted(members())}))
'''


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
             grace: float = DEFAULT_GRACE) -> StopResult:
    jobs = f"{NODE_STATE_DIR}/{JOBS_SUBDIR}"
    cmd = (f"{python} -c {shlex.quote(STOP_SCRIPT)} {shlex.quote(jobs)} "
           f"{shlex.quote(run_id)} {grace}")
    result = conn.run(cmd, timeout=grace + 30)
    lines = result.stdout.strip().splitlines()
    if result.exit_code != 0 or not lines:
        raise RuntimeError(f"{conn.name}: stop script failed: {result.stderr.strip()[-300:]}")
    data = json.loads(lines[-1])
    return StopResult(conn.name, data["found"], bool(data.get("initial")),
                      data.get("killed", []), data.get("left", []), data.get("user", ""),
                      bool(data.get("stale")))
