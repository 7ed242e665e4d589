"""Each worker of a run on this node, read without disturbing it: its Python stack with
py-spy (as the job's user: no extra rights) and its PyTorch flight recorder, which the
worker runner serves on request (worker.py). `diagnose`, a hang found by the supervisors
and `train`'s hang watch all dump through here.
"""

from __future__ import annotations

import base64
import os
import subprocess
import threading
import time
import zlib

from .protocol import FR_SUBDIR, PGID_FILE, RUN_ID_ENV
from .terminate import Tree
from .util import environ, process_table, read_pid

DUMP_TIMEOUT = 30.0  # seconds for one py-spy dump (a busy node, native frames)


def workers(job: str, run_id: str) -> list[tuple[int, int]]:
    """(global rank, pid) of the run's workers on this node: torchrun's children that
    carry the run's id and a RANK (not their own children, e.g. data-loader workers)."""
    pgid = read_pid(os.path.join(job, PGID_FILE))
    if pgid is None:
        return []
    table = process_table()
    found = []
    for pid in Tree(pgid).members():
        if table.get(pid, ("", 0, 0))[1] != pgid:
            continue
        env = environ(pid)
        if env.get(RUN_ID_ENV) == run_id and env.get("RANK", "").isdigit():
            found.append((int(env["RANK"]), pid))
    return sorted(found)


YAMA = "/proc/sys/kernel/yama/ptrace_scope"


def ptrace_hint(said: str) -> str:
    """Why py-spy may not read the job's own worker, when it said permission denied."""
    if not any(w in said.lower() for w in ("permission denied", "not permitted")):
        return ""
    try:
        with open(YAMA) as fh:
            scope = fh.read().strip()
    except OSError:
        return ""
    if scope in ("2", "3"):
        return (f" (kernel.yama.ptrace_scope is {scope} on this node: only root may read "
                "another process's stack; set it to 1 to let users read their own jobs)")
    if scope == "1":
        return (" (kernel.yama.ptrace_scope is 1: a worker started without the worker "
                "runner (--no-clean-exit) lets only its ancestors read its stack)")
    return ""


FR_TIMEOUT = 10.0  # seconds for the workers' flight-recorder dumps


def request_flight_records(job: str, ranks: list[int], token: str) -> dict[int, str]:
    """Ask each rank's runner for its flight recorder (see run_worker.py); the ranks that
    could not be asked, and why."""
    failed = {}
    for rank in ranks:
        try:
            fd = os.open(os.path.join(job, FR_SUBDIR, f"rank{rank}.pipe"),
                         os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:  # ENOENT: not run through the runner; ENXIO: nobody reads
            failed[rank] = f"the worker serves no flight recorder ({exc.strerror})"
            continue
        try:
            os.write(fd, f"{token}\n".encode())
        except OSError as exc:
            failed[rank] = f"the request could not be written ({exc.strerror})"
        finally:
            os.close(fd)
    return failed


def collect_flight_record(job: str, rank: int, token: str, deadline: float) -> dict:
    """{"fr": base64 of zlib of torch's pickled dump} or {"fr_error": why}."""
    path = os.path.join(job, FR_SUBDIR, f"rank{rank}-{token}.pkl")
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return {"fr_error": f"no answer within {FR_TIMEOUT:.0f} s (the rank's Python "
                                "is held: py-spy's stack shows where)"}
        time.sleep(0.05)
    with open(path, "rb") as fh:
        data = fh.read()
    os.unlink(path)
    if not data:
        return {"fr_error": "the rank has no flight recorder (torch not imported, or "
                            "TORCH_FR_BUFFER_SIZE=0)"}
    if data.startswith(b"error: "):
        return {"fr_error": data[7:].decode(errors="replace")}
    return {"fr": base64.b64encode(zlib.compress(data)).decode()}


def dump_workers(job: str, run_id: str, py_spy: str, native: bool) -> list[dict]:
    """Each worker's py-spy dump and flight recorder, taken at once on all of them."""
    def one(rank: int, pid: int, into: dict) -> None:
        cmd = [py_spy, "dump", "--json", "--pid", str(pid)] + (["--native"] if native else [])
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=DUMP_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            into.update(error=f"{type(exc).__name__}: {exc}")
        else:
            if out.returncode != 0:
                said = out.stderr.strip() or f"py-spy exited with {out.returncode}"
                into.update(error=said + ptrace_hint(said))
            else:
                into.update(dump=out.stdout)
        if rank not in unasked:
            into.update(collect_flight_record(job, rank, token, deadline))

    results: list[dict] = [{"rank": rank, "pid": pid} for rank, pid in workers(job, run_id)]
    token = os.urandom(8).hex()
    deadline = time.monotonic() + FR_TIMEOUT
    unasked = request_flight_records(job, [r["rank"] for r in results], token)
    for r in results:
        if r["rank"] in unasked:
            r["fr_error"] = unasked[r["rank"]]
    threads = [threading.Thread(target=one, args=(r["rank"], r["pid"], r)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def py_spy_for(torchrun: str) -> str:
    """py-spy comes with the training environment (environment.yml), next to torchrun."""
    return os.path.join(os.path.dirname(torchrun), "py-spy")
