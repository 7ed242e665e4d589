"""Follow a run's output on this node, as the controller's log stream: JOB/output.log
from the start (or its last N lines) as it grows, ending with the exit marker once the
node's part is over, and with a line HANG_MARKER when this node found the run hung and
dumped its workers (the controller then reads every node's dumps from the share). With
--from-line K, from line K+1 of the log on (a controller whose connection dropped follows
on where it broke). With --lease, each byte read on standard input renews the attached
controller's lease; end-of-input (the controller killed, the connection cut) gives it up
unless a new follower renews it within RECONNECT_GRACE (supervise.py reads it).
The exit marker waits (up to SUPERVISOR_EXIT_WAIT) for the supervisor's own exit: the
exit file comes before its last writes, so a controller that returns on the marker leaves
no process of the run behind.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import BinaryIO

from .protocol import (
    EXIT_FILE,
    EXIT_MARKER,
    HANG_DUMPED,
    HANG_MARKER,
    LEASE_FILE,
    LEASE_LOST,
    OUTPUT_LOG,
    SUPERVISOR_LOG,
    SUPERVISOR_PID,
    End,
)
from .requests import Follow
from .util import last_lines, read_json, read_pid

SUPERVISOR_EXIT_WAIT = 15.0   # seconds: its last state onto the share, the ring's last word


def follow(args: Follow) -> int:
    job = args.job
    if args.lease:
        threading.Thread(target=_hold_lease, args=(job,), daemon=True).start()
    path, exit_path = os.path.join(job, OUTPUT_LOG), os.path.join(job, EXIT_FILE)
    while not os.path.exists(path) and not os.path.exists(exit_path):
        if _supervisor_vanished(job):
            break
        time.sleep(0.1)
    out = sys.stdout.buffer
    last = b"\n"
    hang, announced = os.path.join(job, HANG_DUMPED), False
    if os.path.exists(path):
        with open(path, "rb") as fh:
            if args.tail is not None:
                lines = fh.read().splitlines(keepends=True)
                out.write(b"".join(lines[-args.tail:]) if args.tail else b"")
            elif args.from_line:
                _skip_lines(fh, args.from_line)
            checked = time.monotonic()
            while True:
                ended = os.path.exists(exit_path)  # before reading: no loss
                chunk = fh.read(65536)
                if chunk:
                    out.write(chunk)
                    out.flush()
                    last = chunk[-1:]
                    continue
                if ended:
                    break
                if os.path.exists(hang) != announced:  # dumped for a hang, or moving again
                    announced = not announced
                    if announced:
                        out.write((b"" if last == b"\n" else b"\n")
                                  + f"{HANG_MARKER} {time.time():.3f}\n".encode())
                        out.flush()
                        last = b"\n"
                if time.monotonic() - checked > 1.0:
                    checked = time.monotonic()
                    if _supervisor_vanished(job):
                        break
                time.sleep(0.1)
    final = read_json(exit_path)
    if final is None:  # the supervisor is gone and said nothing: say what it left
        said = last_lines(os.path.join(job, SUPERVISOR_LOG), 5) or [
            "(its log is empty: killed, or out of memory?)"]
        text = "".join(f"clustertrain supervisor ended without an exit status: {line}\n"
                       for line in said)
        out.write((b"" if last == b"\n" else b"\n") + text.encode())
        last = b"\n"
        final = {"code": 1, "reason": End.SUPERVISOR_FAILED.value}
    else:
        _await_supervisor_exit(job, SUPERVISOR_EXIT_WAIT)
    code = int(final.get("code", 1))
    sep = b"" if last == b"\n" else b"\n"  # the marker starts a line of its own
    out.write(sep + f"{EXIT_MARKER} {code} {final.get('reason', End.EXITED.value)} "
                    f"{final.get('why') or '-'}\n".encode())
    out.flush()
    return code


def _skip_lines(fh: BinaryIO, count: int) -> None:
    """Past the first COUNT whole lines of FH (fewer if it has fewer yet: the lines the
    controller saw are all written, so it has them)."""
    for _ in range(count):
        at = fh.tell()
        line = fh.readline()
        if not line.endswith(b"\n"):
            fh.seek(at)
            return


def _supervisor_vanished(job: str) -> bool:
    """The supervisor (its pid in JOB/supervisor.pid, written at launch) is gone without
    an exit status. Unknown (no pid file yet) counts as not gone."""
    pid = read_pid(os.path.join(job, SUPERVISOR_PID))
    if pid is None or _alive(pid):
        return False
    return not os.path.exists(os.path.join(job, EXIT_FILE))  # it may have ended just now


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # the pid now belongs to someone else's process: ours is gone
        return False


def _await_supervisor_exit(job: str, limit: float) -> None:
    """Until the supervisor (which wrote its exit file) has exited, LIMIT seconds at
    most: a share that stalls its last write must not hold the controller for ever."""
    pid = read_pid(os.path.join(job, SUPERVISOR_PID))
    deadline = time.monotonic() + limit
    while pid is not None and pid != os.getpid() and _alive(pid) \
            and time.monotonic() < deadline:
        time.sleep(0.05)


def _hold_lease(job: str) -> None:
    lease = os.path.join(job, LEASE_FILE)
    while True:
        data = sys.stdin.buffer.read1(64)  # type: ignore[union-attr]  # a BufferedReader: has read1
        if not data:  # the controller went away (killed, terminal closed, connection cut)
            if not os.path.exists(os.path.join(job, EXIT_FILE)):
                lost = os.path.join(job, LEASE_LOST)
                with open(lost, "a"):
                    os.utime(lost)   # when: the grace for a new follower counts from it
            return
        # Renew (create: the follower may start before the supervisor made the file).
        with open(lease, "a"):
            os.utime(lease)
