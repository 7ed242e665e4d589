"""The per-run supervisor on each node: owns torchrun, and stops it when the run must end.

Shipped by its source (the launch writes this file into the job directory and starts
it with the node's system python), so it uses the standard library only. Subcommands:

  run     start torchrun in a session of its own and watch over it until it ends:
          - its output goes to JOB/output.log, its exit status to JOB/exit;
          - its state is kept on the shared filesystem (STATE/<node>.json, a heartbeat
            every second) where the loss of one node cannot lose it and every node and
            any later command can read it without the controller;
          - it stops the job when a peer's torchrun failed, when a peer stopped beating
            (node lost), when a stop was requested, or (attached runs) when the
            controller's lease ran out.
  follow  print JOB/output.log (from the start, or its last N lines) as it grows, and
          end with the exit marker once the run is over; with --lease, each byte read on
          stdin renews the controller's lease and end-of-input gives it up at once (the
          controller was killed, or its terminal closed).
  stop    stop the run's torchrun and every descendant: SIGTERM, SIGKILL after a grace
          period (used by the supervisor itself, by the controller and by `stop`).
  dump    the Python stack of every worker of the run with py-spy, and its PyTorch flight
          recorder (`diagnose`, and the controller when a run hangs): a JSON list, one
          entry per rank.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import zlib
from enum import Enum

EXIT_MARKER = "@@clustertrain-exit"
# The launch's handshake (`run --wait-go`): the supervisor says READY once loaded, starts
# on GO, and says STARTED with its PID once it runs in a session of its own.
READY = "@@clustertrain-ready"
GO = "go"
STARTED = "@@clustertrain-started"
BEAT = 1.0            # seconds between heartbeats and checks
PEER_TIMEOUT = 15.0   # a peer whose heartbeat has not moved for this long is lost
PEER_START = 120.0    # a peer that never wrote its state within this long is lost


class End(str, Enum):
    """How a node's part of a run ended. The supervisor writes the value into the node's
    state and the exit marker; the controller adds RUNNING (not ended yet) and LOST (no
    exit status came back: node down, connection cut)."""
    EXITED = "exited"                    # torchrun ended by itself; its code says how
    STOPPED = "stopped"                  # a stop was asked for (Ctrl-C, `stop`)
    CONTROLLER_LOST = "controller-lost"  # the attached controller's lease ran out
    PEER_FAILED = "peer-failed"          # stopped because another node's torchrun failed
    PEER_STOPPED = "peer-stopped"        # ... because another node was stopped
    PEER_LOST = "peer-lost"              # ... because another node went silent
    SUPERVISOR_FAILED = "supervisor-failed"  # the supervisor itself failed or vanished
    HUNG = "hung"                        # no rank made progress (detached: --hang-timeout)
    RUNNING = "running"
    LOST = "lost"

    def __str__(self) -> str:  # the value in f-strings and logs, on every Python 3
        return self.value

    @property
    def caused_elsewhere(self) -> bool:
        """Stopped for something outside this node (never its run's first failure)."""
        return self in (End.STOPPED, End.CONTROLLER_LOST, End.PEER_FAILED,
                        End.PEER_STOPPED, End.PEER_LOST, End.HUNG)


# -- stopping a process tree -------------------------------------------------------------
def _table() -> dict[int, tuple[str, int, int]]:
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            procs[int(d)] = (fields[0], int(fields[1]), int(fields[2]))  # state, ppid, pgrp
    return procs


class Tree:
    """A process group and every descendant of it, also those that left the group
    (torchrun starts its workers in sessions of their own) or were re-parented."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.seen: set[int] = set()

    def members(self) -> set[int]:
        procs = _table()
        live = {p for p, (st, _, pg) in procs.items() if pg == self.pgid and st != "Z"}
        grew = True
        while grew:
            grew = False
            for p, (st, pp, _) in procs.items():
                if pp in live and p not in live and st != "Z":
                    live.add(p)
                    grew = True
        live |= {p for p in self.seen if p in procs and procs[p][0] != "Z"}
        self.seen |= live
        return live


def belongs(pid: int | None, run_id: str) -> bool:
    """Whether PID carries the run's id in its environment (not a reused PID)."""
    return pid is not None and _environ(pid).get("CLUSTERTRAIN_RUN_ID") == run_id


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def read_pid(path: str) -> int | None:
    try:
        with open(path) as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# A supervisor launched a moment ago starts torchrun and records its group within this.
STARTING = 10.0


def stop_tree(job: str, run_id: str, grace: float) -> dict:
    """Stop the run whose torchrun recorded its process group in JOB/pgid. A run whose
    supervisor has been launched but has not started torchrun yet is stopped too: asked
    first, it never starts torchrun; a moment late, it records the group, which is then
    stopped here."""
    me = getpass.getuser()
    pgid = read_pid(os.path.join(job, "pgid"))
    supervisor = read_pid(os.path.join(job, "supervisor.pid"))
    starting = pgid is None and supervisor is not None and belongs(supervisor, run_id)
    if pgid is None and not starting:
        return {"found": False, "user": me, "killed": [], "left": []}
    with open(os.path.join(job, "stop-requested"), "a") as fh:
        fh.write(f"{time.time()}\n")
    deadline = time.monotonic() + STARTING
    while pgid is None and belongs(supervisor, run_id) and time.monotonic() < deadline:
        time.sleep(0.05)
        pgid = read_pid(os.path.join(job, "pgid"))
    if pgid is None:  # it ended before starting torchrun (or is stuck: say so)
        left = [supervisor] if belongs(supervisor, run_id) else []
        return {"found": True, "user": me, "initial": left, "killed": [], "left": left}
    tree = Tree(pgid)
    start = tree.members()
    if start and not any(belongs(p, run_id) for p in start):
        # The PID was reused by something that is not this run: signal nothing.
        return {"found": True, "user": me, "pgid": pgid, "initial": [], "killed": [],
                "left": [], "stale": True}
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + grace
    while tree.members() and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = sorted(tree.members())
    for p in killed:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 5  # a killed process needs a moment on a busy node
    while tree.members() and time.monotonic() < deadline:
        time.sleep(0.1)
    with open(os.path.join(job, "stopped"), "w") as fh:
        fh.write(str(time.time()))
    return {"found": True, "user": me, "pgid": pgid, "initial": sorted(start),
            "killed": killed, "left": sorted(tree.members())}


# -- stack dumps -------------------------------------------------------------------------
DUMP_TIMEOUT = 30.0  # seconds for one py-spy dump (a busy node, native frames)


def workers(job: str, run_id: str) -> list[tuple[int, int]]:
    """(global rank, pid) of the run's workers on this node: torchrun's children that
    carry the run's id and a RANK (not their own children, e.g. data-loader workers)."""
    pgid = read_pid(os.path.join(job, "pgid"))
    if pgid is None:
        return []
    table = _table()
    found = []
    for pid in Tree(pgid).members():
        if table.get(pid, ("", 0, 0))[1] != pgid:
            continue
        env = _environ(pid)
        if env.get("CLUSTERTRAIN_RUN_ID") == run_id and env.get("RANK", "").isdigit():
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
HANG_SUBDIR = "hang"  # STATE/hang/<node>.json: a detached run's hang dumps, on the share
HANG_GATHER = 45.0    # seconds a node that dumped waits for its peers' dumps before stopping
FR_SUBDIR = "fr"   # JOB/fr: the workers' request pipes and flight-recorder dumps
TIMEOUT_DUMP_PREFIX = "timeout-rank"  # torch's own dump on a NCCL timeout: JOB/fr/<this>R


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


# -- shared state ------------------------------------------------------------------------
def write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> dict | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


class Peers:
    """What this node knows of the other nodes, from their state files on the share.
    A heartbeat counts as alive when it changes, timed by this node's own clock."""

    def __init__(self, state_dir: str, names: list[str], me: str) -> None:
        self.state_dir, self.names, self.me = state_dir, [n for n in names if n != me], me
        self.last: dict[str, tuple[object, float]] = {}
        self.states: dict[str, dict] = {}   # each peer's state at the last verdict()
        self.started = time.monotonic()

    def verdict(self) -> tuple[End, str] | None:
        """('peer-lost'|'peer-failed'|'peer-stopped', node) when the run must stop here:
        a peer went silent, a peer's torchrun failed, or a peer was stopped (for any
        reason: a node cut off from the others ends too). None while all is well. Of
        several seen at once, the earliest cause comes first: a peer found lost has been
        silent for PEER_TIMEOUT, longer than a failure seen since the last look; a peer
        stopped because another failed names that other, whichever this node reads first."""
        now = time.monotonic()
        found: dict[End, str] = {}
        for name in self.names:
            state = read_json(os.path.join(self.state_dir, f"{name}.json"))
            seen = self.last.get(name)
            if state is None:  # not written yet, or unreadable for a moment (NFS: ESTALE)
                since = seen[1] if seen else self.started
                if now - since > (PEER_TIMEOUT if seen else PEER_START):
                    found.setdefault(End.PEER_LOST, name)
                continue
            self.states[name] = state
            if state.get("state") == "ended":
                reason = state.get("reason")
                if reason == End.SUPERVISOR_FAILED or (
                        reason == End.EXITED and state.get("code") != 0):
                    found.setdefault(End.PEER_FAILED, name)
                elif reason == End.HUNG:  # a peer found the run hung: so is it here
                    found.setdefault(End.HUNG, name)
                elif reason != End.EXITED:
                    found.setdefault(End.PEER_STOPPED, name)
                continue
            beat = state.get("beat")
            if seen is None or seen[0] != beat:
                self.last[name] = (beat, now)
            elif now - seen[1] > PEER_TIMEOUT:
                found.setdefault(End.PEER_LOST, name)
        for kind in (End.PEER_LOST, End.PEER_FAILED, End.HUNG, End.PEER_STOPPED):
            if kind in found:
                return kind, found[kind]
        return None

    def any_dumped(self) -> bool:
        """A peer found the run hung and dumped its workers (see _supervise)."""
        return any(s.get("hang") == "dumped" for s in self.states.values())

    def all_dumped(self) -> bool:
        """Every peer has dumped its workers for this hang, or has ended."""
        return all((self.states.get(n) or {}).get("hang") == "dumped"
                   or (self.states.get(n) or {}).get("state") == "ended" for n in self.names)

    def quiet(self) -> float | None:
        """The shortest time without progress any running peer reported at its last
        beat (each by its own clock); None if one has not reported it."""
        times = [(self.states.get(n) or {}).get("quiet_s") for n in self.names]
        known = [float(t) for t in times if isinstance(t, (int, float))]
        return min(known, default=float("inf")) if len(known) == len(times) else None


# -- prune -------------------------------------------------------------------------------
def _live(job: str) -> bool:
    """A run whose supervisor has not recorded an end and whose torchrun still runs."""
    if os.path.exists(os.path.join(job, "exit")):
        return False
    pgid = read_pid(os.path.join(job, "pgid"))
    if pgid is not None:
        try:
            os.kill(pgid, 0)
            return True
        except OSError:
            pass
    # No process (yet): a run being launched right now is young; keep it a while.
    try:
        return time.time() - os.stat(job).st_mtime < 3600
    except OSError:
        return False


def prune(state: str, keep: int, current: str) -> list[str]:
    """Remove the code snapshots and job directories of all but the KEEP newest runs of
    this user on this node; never those of a live run, nor the current one."""
    jobs, code = os.path.join(state, "jobs"), os.path.join(state, "code")
    runs = set()
    for d in (jobs, code):
        if os.path.isdir(d):
            runs |= {r for r in os.listdir(d) if r != "latest"}
    try:
        latest = os.path.basename(os.path.realpath(os.path.join(code, "latest")))
    except OSError:
        latest = ""
    old = sorted(runs)[:-keep] if keep > 0 else sorted(runs)  # run ids sort by time
    removed = []
    for run_id in old:
        if run_id in (current, latest) or _live(os.path.join(jobs, run_id)):
            continue
        for d in (jobs, code):
            path = os.path.join(d, run_id)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
        removed.append(run_id)
    return removed


# -- run ---------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """Supervise the run (see _supervise); whatever goes wrong, the run ends with an exit
    status: a supervisor that died silently would leave its followers waiting forever.
    With --wait-go, first the launch's handshake (await_go)."""
    if args.wait_go:
        if not await_go(args.job, args.cwd):
            return 0
    elif args.cwd:
        os.chdir(args.cwd)
    try:
        return _supervise(args)
    except Exception as exc:  # noqa: BLE001 - any failure of ours ends this node's part
        _failed(args, f"{type(exc).__name__}: {exc}")
        return 1


def await_go(job: str, cwd: str | None) -> bool:
    """The launch's two phases, so that torchrun starts on every node at once: loaded
    (Python's start and imports are most of what a launch costs a node), say READY on
    standard output and wait for GO on standard input; then go to CWD (the code snapshot,
    synced meanwhile) and detach: the PID goes to JOB/supervisor.pid, STARTED and the PID
    to the launch, and this process goes on in a session of its own with its output in
    JOB/supervisor.log. False if the launch was called off first (end of input): nothing
    was started."""
    print(READY, flush=True)
    if sys.stdin.readline().strip() != GO:
        return False
    if cwd:
        os.chdir(cwd)  # a snapshot that is not there fails the launch, with its path
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        with open(os.path.join(job, "supervisor.pid"), "w") as fh:
            fh.write(f"{pid}\n")
        print(f"{STARTED} {pid}", flush=True)
        os._exit(0)
    log = os.open(os.path.join(job, "supervisor.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                  0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, to in ((null, 0), (log, 1), (log, 2)):
        os.dup2(fd, to)
    os.close(null)
    os.close(log)
    os.setsid()
    return True


def _failed(args: argparse.Namespace, why: str) -> None:
    traceback.print_exc()  # into supervisor.log
    job = args.job
    if os.path.exists(os.path.join(job, "pgid")):  # torchrun must not outlive us
        try:
            stop_tree(job, args.run, args.grace)
        except Exception:  # noqa: BLE001 - stopping is best effort here: say the rest
            traceback.print_exc()
    message = f"clustertrain supervisor on {args.node} failed: {why}\n"
    final = {"node": args.node, "user": getpass.getuser(), "state": "ended", "code": 1,
             "reason": End.SUPERVISOR_FAILED.value, "why": why, "ended": time.time(),
             "time": time.time()}
    writes = [lambda: _append(os.path.join(job, "output.log"), message),
              lambda: write_json(os.path.join(job, "exit"), final)]
    if args.state_dir:  # the peers stop too
        writes.insert(1, lambda: write_json(os.path.join(args.state_dir, f"{args.node}.json"),
                                            final))
    for write in writes:
        try:
            write()
        except OSError:
            traceback.print_exc()


def _append(path: str, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def _supervise(args: argparse.Namespace) -> int:
    job, state_dir = args.job, args.state_dir
    os.makedirs(state_dir, exist_ok=True)
    mine = os.path.join(state_dir, f"{args.node}.json")
    lease = os.path.join(job, "lease")
    if args.attached:
        open(lease, "w").close()
    if os.path.exists(os.path.join(job, "stop-requested")):
        # Stopped before torchrun started (the launch failed on another node).
        final = {"node": args.node, "user": getpass.getuser(), "state": "ended",
                 "code": 0, "reason": End.STOPPED.value, "why": "", "ended": time.time(),
                 "time": time.time()}
        write_json(mine, final)
        write_json(os.path.join(job, "exit"), final)
        return 0
    os.makedirs(os.path.join(job, FR_SUBDIR), exist_ok=True)  # torch's timeout dumps too
    with open(os.path.join(job, "output.log"), "ab") as out:
        proc = subprocess.Popen(args.argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    with open(os.path.join(job, "pgid"), "w") as fh:
        fh.write(f"{proc.pid}\n")
    if args.keep:  # old runs' files go while torchrun starts, not before
        threading.Thread(target=prune, args=(os.path.dirname(os.path.dirname(job)),
                                              args.keep, args.run), daemon=True).start()
    peers = Peers(state_dir, args.nodes.split(","), args.node)
    beat, why = 0, ""
    reason: End | None = None
    dumped_at: float | None = None  # this hang's stacks are on the share (once a hang)
    state = {"node": args.node, "user": getpass.getuser(), "state": "running",
             "pid": proc.pid, "started": time.time()}
    while proc.poll() is None:
        beat += 1
        quiet = _quiet_for(job)
        try:
            write_json(mine, {**state, "beat": beat, "time": time.time(),
                              "quiet_s": round(quiet, 1)})
        except OSError as exc:  # the share, for a moment; for long, the peers stop
            print(f"{time.strftime('%H:%M:%S')} heartbeat not written: {exc}", flush=True)
        if reason is None:
            found = peers.verdict()
            # Hung: no node made progress for the timeout. Every node dumps its workers
            # first and says so in its state; with --on-hang stop, a node stops only once
            # every peer has dumped (or HANG_GATHER passed), or its stop would end the
            # others' ranks before they are dumped. A peer's word starts this node's dump.
            stopping = args.on_hang == "stop"
            hung = args.hang_timeout > 0 and (
                (found is not None and found[0] == End.HUNG)
                or (found is None and (min(quiet, peers.quiet() or 0.0) >= args.hang_timeout
                                       or (stopping and peers.any_dumped()))))
            if not hung and quiet < args.hang_timeout and dumped_at is not None:
                dumped_at = None  # progress again (--on-hang wait): a later hang is new
                state.pop("hang", None)
            if hung and dumped_at is None:
                _dump_hang(args, quiet)
                dumped_at = time.monotonic()
                state["hang"] = "dumped"
            if hung and stopping and dumped_at is not None and (
                    peers.all_dumped() or time.monotonic() - dumped_at > HANG_GATHER):
                reason, why = End.HUNG, (f"no rank made progress for {quiet:.0f} s "
                                         f"(--hang-timeout {args.hang_timeout:g})")
            elif hung:
                pass  # dumped; waiting for the peers' dumps (stop) or for progress (wait)
            elif found:
                reason, why = found[0], found[1]
            elif os.path.exists(os.path.join(job, "stop-requested")):
                reason = End.STOPPED
            elif args.attached and _lease_gone(job, args.lease_timeout):
                reason = End.CONTROLLER_LOST
            if reason and reason != End.STOPPED:
                threading.Thread(target=stop_tree, args=(job, args.run, args.grace),
                                 daemon=True).start()
        try:
            proc.wait(timeout=BEAT)
        except subprocess.TimeoutExpired:
            pass
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    if reason is None and os.path.exists(os.path.join(job, "stop-requested")):
        reason = End.STOPPED
    if reason is None and dumped_at is not None and args.on_hang == "stop":
        # Hung and dumped: a peer stopped first, and this node's ranks ended with it.
        reason, why = End.HUNG, f"no rank made progress (--hang-timeout {args.hang_timeout:g})"
    final = {**state, "state": "ended", "code": code, "reason": (reason or End.EXITED).value,
             "why": why, "beat": beat + 1, "ended": time.time()}
    write_json(mine, final)
    write_json(os.path.join(job, "exit"), final)
    return 0


def _quiet_for(job: str) -> float:
    """Seconds since the job last printed anything (a line, a beat, part of a line)."""
    try:
        return max(0.0, time.time() - os.stat(os.path.join(job, "output.log")).st_mtime)
    except OSError:
        return 0.0


def py_spy_for(torchrun: str) -> str:
    """py-spy comes with the training environment (environment.yml), next to torchrun."""
    return os.path.join(os.path.dirname(torchrun), "py-spy")


def _dump_hang(args: argparse.Namespace, quiet: float) -> None:
    """Every worker's stack and flight recorder of this node, for the run's record: on
    the share, STATE/hang/<node>.json (records.settle reads them through any node)."""
    into = os.path.join(args.state_dir, HANG_SUBDIR)
    print(f"{time.strftime('%H:%M:%S')} no rank made progress for {quiet:.0f} s: dumping "
          "this node's workers", flush=True)
    try:
        os.makedirs(into, exist_ok=True)
        ranks = dump_workers(args.job, args.run, py_spy_for(args.argv[0]), False)
        write_json(os.path.join(into, f"{args.node}.json"),
                   {"node": args.node, "detected_at": time.time(),
                    "quiet_s": round(quiet, 1), "ranks": ranks})
    except OSError as exc:
        print(f"{time.strftime('%H:%M:%S')} hang dump not written: {exc}", flush=True)


def _lease_gone(job: str, timeout: float) -> bool:
    if os.path.exists(os.path.join(job, "lease-lost")):
        return True
    try:
        return time.time() - os.stat(os.path.join(job, "lease")).st_mtime > timeout
    except OSError:
        return True


# -- follow ------------------------------------------------------------------------------
def follow(args: argparse.Namespace) -> int:
    job = args.job
    if args.lease:
        threading.Thread(target=_hold_lease, args=(job,), daemon=True).start()
    path, exit_path = os.path.join(job, "output.log"), os.path.join(job, "exit")
    while not os.path.exists(path) and not os.path.exists(exit_path):
        if _supervisor_vanished(job):
            break
        time.sleep(0.1)
    out = sys.stdout.buffer
    last = b"\n"
    if os.path.exists(path):
        with open(path, "rb") as fh:
            if args.tail is not None:
                lines = fh.read().splitlines(keepends=True)
                out.write(b"".join(lines[-args.tail:]) if args.tail else b"")
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
                if time.monotonic() - checked > 1.0:
                    checked = time.monotonic()
                    if _supervisor_vanished(job):
                        break
                time.sleep(0.1)
    final = read_json(exit_path)
    if final is None:  # the supervisor is gone and said nothing: say what it left
        said = _last_lines(os.path.join(job, "supervisor.log"), 5) or [
            "(its log is empty: killed, or out of memory?)"]
        text = "".join(f"clustertrain supervisor ended without an exit status: {line}\n"
                       for line in said)
        out.write((b"" if last == b"\n" else b"\n") + text.encode())
        last = b"\n"
        final = {"code": 1, "reason": End.SUPERVISOR_FAILED.value}
    code = int(final.get("code", 1))
    sep = b"" if last == b"\n" else b"\n"  # the marker starts a line of its own
    out.write(sep + f"{EXIT_MARKER} {code} {final.get('reason', End.EXITED.value)} "
                    f"{final.get('why') or '-'}\n".encode())
    out.flush()
    return code


def _supervisor_vanished(job: str) -> bool:
    """The supervisor (its pid in JOB/supervisor.pid, written at launch) is gone without
    an exit status. Unknown (no pid file yet) counts as not gone."""
    pid = read_pid(os.path.join(job, "supervisor.pid"))
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        pass
    except PermissionError:  # the pid now belongs to someone else's process: ours is gone
        pass
    return not os.path.exists(os.path.join(job, "exit"))  # it may have ended just now


def _last_lines(path: str, n: int) -> list[str]:
    try:
        with open(path, errors="replace") as fh:
            return [line.rstrip() for line in fh.read().splitlines() if line.strip()][-n:]
    except OSError:
        return []


def _hold_lease(job: str) -> None:
    lease = os.path.join(job, "lease")
    while True:
        data = sys.stdin.buffer.read1(64)  # type: ignore[union-attr]  # a BufferedReader: has read1
        if not data:  # the controller went away (killed, terminal closed, connection cut)
            if not os.path.exists(os.path.join(job, "exit")):
                open(os.path.join(job, "lease-lost"), "w").close()
            return
        # Renew (create: the follower may start before the supervisor made the file).
        with open(lease, "a"):
            os.utime(lease)


# -- command line ------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="supervisor")
    sub = p.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("run")
    r.add_argument("--job", required=True)
    r.add_argument("--state-dir", required=True)
    r.add_argument("--run", required=True)
    r.add_argument("--node", required=True)
    r.add_argument("--nodes", required=True)
    r.add_argument("--grace", type=float, default=5.0)
    r.add_argument("--lease-timeout", type=float, default=30.0)
    r.add_argument("--attached", action="store_true")
    r.add_argument("--hang-timeout", type=float, default=0.0,
                   help="detached runs: seconds without progress on every node after which "
                   "the run is hung (0: not watched here)")
    r.add_argument("--on-hang", choices=("stop", "wait"), default="stop")
    r.add_argument("--keep", type=int, default=0,
                   help="prune all but the KEEP newest runs' snapshots and job dirs")
    r.add_argument("--cwd", help="torchrun's working directory (the run's code snapshot)")
    r.add_argument("--wait-go", action="store_true",
                   help=f"say {READY}, start on {GO!r} (on stdin), then detach")
    r.add_argument("argv", nargs=argparse.REMAINDER)
    f = sub.add_parser("follow")
    f.add_argument("--job", required=True)
    f.add_argument("--tail", type=int)
    f.add_argument("--lease", action="store_true")
    s = sub.add_parser("stop")
    s.add_argument("jobs")      # the jobs directory, relative to the user's home
    s.add_argument("run")
    s.add_argument("grace", type=float)
    d = sub.add_parser("dump")
    d.add_argument("jobs")      # the jobs directory, relative to the user's home
    d.add_argument("run")
    d.add_argument("py_spy")
    d.add_argument("--native", action="store_true")
    args = p.parse_args(argv)
    if args.verb == "run":
        if args.argv and args.argv[0] == "--":
            args.argv = args.argv[1:]
        return run(args)
    if args.verb == "follow":
        code = follow(args)
        sys.stdout.flush()
        os._exit(code)  # the lease thread may be blocked reading stdin: do not wait for it
    job = os.path.join(os.path.expanduser("~"), args.jobs, args.run)
    if args.verb == "dump":
        print(json.dumps(dump_workers(job, args.run, args.py_spy, args.native)))
        return 0
    print(json.dumps(stop_tree(job, args.run, args.grace)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
