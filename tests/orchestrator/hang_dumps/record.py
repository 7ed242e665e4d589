"""Re-record the hang fixtures from real processes (see README.md):

    python record.py --torchrun PATH/TO/torchrun --py-spy PATH/TO/py-spy [MODE...]

For each mode it starts hang_job.py under torchrun (--standalone, 4 ranks, through the
project's worker runner orchestrator/run_worker.py, as `train` starts workers), waits
until every rank has reached the hang point, dumps every rank with `py-spy dump --json`
(async_wait also with --native: the wait() on a Work object is a C++ frame), has every rank
write its flight-recorder dump, writes MODE/ranks.json (node, rank, pid) and stops the job.

All ranks run on this host; the node names in ranks.json are labels (NODE_SIZE ranks a
node, node0, node1, ...), as the orchestrator would give them from its inventory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNNER = HERE.parents[2] / "orchestrator" / "run_worker.py"
WORLD = 4
NODE_SIZE = 2
NATIVE = {"async_wait"}
MODES = ("stall", "mismatch", "tie", "healthy", "async_wait")
SETTLE_S = 3.0    # after the last rank is ready: time for all to block where they hang
READY_TIMEOUT_S = 180.0


def _wait_for(paths: list[Path], proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all(p.exists() for p in paths):
        if proc.poll() is not None:
            raise SystemExit(f"torchrun ended (status {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def _dump_stacks(py_spy: str, ranks: list[dict], native: bool, dest: Path) -> None:
    for r in ranks:
        cmd = [py_spy, "dump", "--json", "--pid", str(r["pid"])] + (["--native"] if native else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        json.loads(out)  # it is what py-spy printed, unchanged; only checked to be JSON
        (dest / f"rank{r['rank']}.json").write_text(out)


def _stop(proc: subprocess.Popen, pids: list[int]) -> None:
    """torchrun's process group first, then the workers (torchrun starts each in a
    session of its own), by the pids they reported."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def record(mode: str, torchrun: str, py_spy: str) -> None:
    dest = HERE / mode
    work = Path(tempfile.mkdtemp(prefix=f"hang-{mode}-"))
    cmd = [torchrun, "--standalone", "--nproc-per-node", str(WORLD), str(RUNNER),
           str(HERE / "hang_job.py"), mode, str(work)]
    log = open(work / "torchrun.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    pids: list[int] = []
    try:
        _wait_for([work / f"ready_rank{r}.json" for r in range(WORLD)], proc,
                  "every rank's ready file")
        ready = [json.loads((work / f"ready_rank{r}.json").read_text()) for r in range(WORLD)]
        pids = [r["pid"] for r in ready]
        time.sleep(SETTLE_S)
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        _dump_stacks(py_spy, ready, mode in NATIVE, dest)
        (work / "trigger").touch()
        frs = [work / f"fr_rank{r}.{ext}" for r in range(WORLD) for ext in ("pkl", "json")]
        _wait_for(frs, proc, "every rank's flight-recorder dump")
        time.sleep(0.5)  # the .json is written after the .pkl; let the last one close
        for f in frs:
            shutil.copy(f, dest / f.name)
        ranks = [{"node": f"node{r['rank'] // NODE_SIZE}", "rank": r["rank"], "pid": r["pid"]}
                 for r in ready]
        (dest / "ranks.json").write_text(json.dumps(ranks, indent=1) + "\n")
        if proc.poll() is not None:
            raise SystemExit(f"{mode}: the job ended while it was dumped: it did not hang")
    finally:
        _stop(proc, pids)
        log.close()
    shutil.rmtree(work)
    print(f"{mode}: recorded {WORLD} ranks into {dest}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torchrun", default="torchrun")
    ap.add_argument("--py-spy", default="py-spy")
    ap.add_argument("modes", nargs="*", metavar="MODE", help=f"some of {', '.join(MODES)}")
    args = ap.parse_args()
    unknown = set(args.modes) - set(MODES)
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(sorted(unknown))}: choose from {', '.join(MODES)}")
    for mode in args.modes or MODES:
        record(mode, args.torchrun, args.py_spy)


if __name__ == "__main__":
    main()
