"""The per-run supervisor on each node (`node.py supervise`): owns torchrun, and stops it
when the run must end.

- torchrun runs in a session of its own; its output goes to JOB/output.log, its exit
  status to JOB/exit;
- the nodes hear of each other over the network, in a ring of UDP beats (ring.py): one
  beat a second in and out per node at any size, and a share that stalls is not taken for
  dead nodes;
- the node's state is kept on the shared filesystem (STATE/<node>.json, written when it
  changes: statefile.py) where the loss of one node cannot lose it and any later command
  can read it without the controller;
- it stops the job when a peer's torchrun failed, when a peer went silent (node lost),
  when a stop was requested, when the run is hung (no node printed anything for
  --hang-timeout: each node dumps its workers onto the share first), or (attached runs)
  when the controller's lease ran out, or when the run's Slurm job ended (slurmjob.py);
- a run with a Slurm job cancels it once every node's part has ended.
"""

from __future__ import annotations

import argparse
import getpass
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback

from . import slurmjob
from .carry import kept
from .dump import dump_workers, py_spy_for
from .protocol import (
    BEAT,
    BEAT_MARKER,
    CODE_SUBDIR,
    COLLECTIVE_TIMEOUT,
    EXIT_FILE,
    FR_SUBDIR,
    HANG_DUMPED,
    HANG_GATHER,
    HANG_INTERVAL,
    HANG_SAMPLES,
    HANG_SUBDIR,
    JOBS_SUBDIR,
    LEASE_FILE,
    LEASE_LOST,
    OUTPUT_LOG,
    PEER_TIMEOUT,
    PGID_FILE,
    READY,
    RECONNECT_GRACE,
    RING_KEY_BYTES,
    STARTED,
    STOP_REQUESTED,
    SUPERVISOR_LOG,
    SUPERVISOR_PID,
    TIMEOUT_DUMP_WAIT,
    End,
    GoWord,
    parse_ports,
)
from .ring import Counters, Ring, read_state, resolve, ring_socket
from .statefile import StateFile
from .stop import stop_tree
from .util import detach, read_json, read_pid, write_json

TAIL_BYTES = 64 * 1024  # of torchrun's output, read for the words of a collective timeout
HELD_UP = 5 * BEAT      # a loop slower than this: this supervisor itself was held up


class Peers:
    """What this node knows of the other nodes of the run: their word over the ring
    (ring.py), never their files on the share read every second."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring

    def verdict(self) -> tuple[End, str] | None:
        """('peer-lost'|'peer-failed'|'peer-stopped'|'hung', node) when the run must stop
        here: a peer went silent on the network, a peer's torchrun failed, a peer found the
        run hung, or a peer was stopped (for any reason: a node cut off from the others ends
        too). None while all is well. Of several known at once, a lost peer comes first
        (silent for PEER_TIMEOUT, longer than any failure since), then a failure: a peer
        stopped because another failed names that other."""
        self.ring.look()
        found: dict[End, str] = {}
        for name in self.ring.lost_peers():
            found.setdefault(End.PEER_LOST, name)
        for name, state in self.ring.peers_status().items():
            if state.get("state") != "ended":
                continue
            reason = state.get("reason")
            if reason == End.SUPERVISOR_FAILED or (
                    reason == End.EXITED and state.get("code") != 0):
                found.setdefault(End.PEER_FAILED, name)
            elif reason == End.HUNG:  # a peer found the run hung: so is it here
                found.setdefault(End.HUNG, name)
            elif reason != End.EXITED:
                found.setdefault(End.PEER_STOPPED, name)
        for kind in (End.PEER_LOST, End.PEER_FAILED, End.HUNG, End.PEER_STOPPED):
            if kind in found:
                return kind, found[kind]
        return None

    def timed_out(self, name: str) -> bool:
        """Peer NAME's torchrun failed after a collective timed out (see _timed_out)."""
        return bool(self.ring.peers_status().get(name, {}).get("timed_out"))

    def any_dumped(self) -> bool:
        """A peer found the run hung and dumped its workers (see _supervise)."""
        return any(s.get("hang") == "dumped" for s in self.ring.peers_status().values())

    def all_dumped(self) -> bool:
        """Every peer has dumped its workers for this hang, or has ended."""
        known = self.ring.peers_status()
        return all((known.get(n) or {}).get("hang") == "dumped"
                   or (known.get(n) or {}).get("state") == "ended"
                   for n in self.ring.names if n != self.ring.me)

    def quiet(self) -> float | None:
        """How long the whole run has made no progress, as the ring knows it (None until
        a peer was heard)."""
        return self.ring.quiet()


def all_ended(state_dir: str, names: list[str]) -> bool:
    """Every node's state file, read now, says its part has ended."""
    return all((read_json(os.path.join(state_dir, f"{n}.json")) or {}).get("state")
               == "ended" for n in names)


def _live(job: str) -> bool:
    """A run whose supervisor has not recorded an end and whose torchrun still runs."""
    if os.path.exists(os.path.join(job, EXIT_FILE)):
        return False
    pgid = read_pid(os.path.join(job, PGID_FILE))
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
    this user on this node; never those of a live run, nor the current one, nor the last
    run of a work directory (its next run carries what it wrote: carry.py)."""
    jobs, code = os.path.join(state, JOBS_SUBDIR), os.path.join(state, CODE_SUBDIR)
    runs = set()
    for d in (jobs, code):
        if os.path.isdir(d):
            runs |= {r for r in os.listdir(d) if r != "latest" and not r.startswith(".")}
    try:
        latest = os.path.basename(os.path.realpath(os.path.join(code, "latest")))
    except OSError:
        latest = ""
    old = sorted(runs)[:-keep] if keep > 0 else sorted(runs)  # run ids sort by time
    carried = kept(code)
    removed = []
    for run_id in old:
        if run_id in (current, latest) or run_id in carried or \
                _live(os.path.join(jobs, run_id)):
            continue
        for d in (jobs, code):
            path = os.path.join(d, run_id)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
        removed.append(run_id)
    return removed


def run(args: argparse.Namespace) -> int:
    """Supervise the run (see _supervise); whatever goes wrong, the run ends with an exit
    status: a supervisor that died silently would leave its followers waiting forever.
    With --wait-go, first the launch's handshake (await_go), which brings the run's ring
    key; without, the key is read from --key-file (a supervisor started by hand)."""
    names = args.nodes.split(",")
    addresses = resolve(names, (args.addresses or "").split(","))
    # Before READY: its port goes to the peers with GO.
    sock = ring_socket(addresses, parse_ports(args.ring_ports) if args.ring_ports else None)
    if args.wait_go:
        go = await_go(args.job, args.cwd, sock.getsockname()[1])
        if go is None:
            return 0
    else:
        go = GoWord(read_key(args.key_file, alone=len(names) == 1))
        if args.cwd:
            os.chdir(args.cwd)
    ring = Ring(args.run, args.node, names, addresses,
                lambda name: read_state(args.state_dir, name), Counters(), go.key,
                sock=sock, ports=go.ports)
    try:
        return _supervise(args, ring, go.env)
    except Exception as exc:  # noqa: BLE001 - any failure of ours ends this node's part
        _failed(args, f"{type(exc).__name__}: {exc}", ring)
        return 1


def read_key(path: str | None, alone: bool) -> bytes:
    """A run's ring key from PATH (hex, a file only its user reads); without, a key of
    its own for a node ALONE in its run (it has no ring), else ValueError."""
    if not path:
        if alone:
            return os.urandom(RING_KEY_BYTES)
        raise ValueError("supervise needs the run's ring key: --wait-go (the launch's GO "
                         "brings it) or --key-file FILE")
    with open(path, encoding="ascii") as fh:
        return bytes.fromhex(fh.read().strip())


def await_go(job: str, cwd: str | None, ring_port: int) -> GoWord | None:
    """The launch's two phases, so that torchrun starts on every node at once: loaded
    (Python's start and imports are most of what a launch costs a node), say READY and
    this node's ring port on standard output and wait for GO on standard input, which
    brings every node's ring port (the peers' beats need no share to find each other), the
    run's ring key and the job's secret variables (protocol.GoWord); then go to CWD (the
    code snapshot, synced meanwhile) and detach: the PID goes to JOB/supervisor.pid,
    STARTED and the PID to the launch, and this process goes on in a session of its own
    with its output in JOB/supervisor.log. None if the launch was called off first (end
    of input): nothing was started."""
    print(f"{READY} {ring_port}", flush=True)
    go = GoWord.parse(sys.stdin.readline())
    if go is None:
        return None
    if cwd:
        os.chdir(cwd)  # a snapshot that is not there fails the launch, with its path
    pid = detach(os.path.join(job, SUPERVISOR_LOG))
    if pid:
        with open(os.path.join(job, SUPERVISOR_PID), "w") as fh:
            fh.write(f"{pid}\n")
        print(f"{STARTED} {pid}", flush=True)
        os._exit(0)
    return go


def _failed(args: argparse.Namespace, why: str, ring: Ring) -> None:
    traceback.print_exc()  # into supervisor.log
    job = args.job
    if os.path.exists(os.path.join(job, PGID_FILE)):  # torchrun must not outlive us
        try:
            stop_tree(job, args.run, args.grace)
        except Exception:  # noqa: BLE001 - stopping is best effort here: say the rest
            traceback.print_exc()
    message = f"clustertrain supervisor on {args.node} failed: {why}\n"
    final = {"node": args.node, "user": getpass.getuser(), "state": "ended", "code": 1,
             "reason": End.SUPERVISOR_FAILED.value, "why": why, "ended": time.time(),
             "time": time.time()}
    # The peers stop too: told over the ring first, then the share.
    ring.last_word(state="ended", code=1, reason=End.SUPERVISOR_FAILED.value, why=why)
    writes = [lambda: _append(os.path.join(job, OUTPUT_LOG), message),
              lambda: write_json(os.path.join(job, EXIT_FILE), final)]
    if args.state_dir:  # the peers stop too
        writes.insert(1, lambda: write_json(os.path.join(args.state_dir, f"{args.node}.json"),
                                            final))
    for write in writes:
        try:
            write()
        except OSError:
            traceback.print_exc()
    slurm = slurmjob.job_id()
    if slurm:   # the run has failed (its peers stop too): its Slurm job goes now
        slurmjob.release(slurm, lambda: True)


def _append(path: str, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def _supervise(args: argparse.Namespace, ring: Ring, secret_env: dict[str, str]) -> int:
    job, state_dir = args.job, args.state_dir
    os.makedirs(state_dir, exist_ok=True)
    mine = os.path.join(state_dir, f"{args.node}.json")
    lease = os.path.join(job, LEASE_FILE)
    if args.attached:
        open(lease, "w").close()
    if os.path.exists(os.path.join(job, STOP_REQUESTED)):
        # Stopped before torchrun started (the launch failed on another node).
        final = {"node": args.node, "user": getpass.getuser(), "state": "ended",
                 "code": 0, "reason": End.STOPPED.value, "why": "", "ended": time.time(),
                 "time": time.time()}
        write_json(mine, final)
        write_json(os.path.join(job, EXIT_FILE), final)
        return 0
    os.makedirs(os.path.join(job, FR_SUBDIR), exist_ok=True)  # torch's timeout dumps too
    with open(os.path.join(job, OUTPUT_LOG), "ab") as out:
        # The job's secret variables reach torchrun and its workers in their environment
        # (which only this user and root can read), never on a command line.
        proc = subprocess.Popen(args.argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **secret_env} if secret_env else None)
    with open(os.path.join(job, PGID_FILE), "w") as fh:
        fh.write(f"{proc.pid}\n")
    if args.keep:  # old runs' files go while torchrun starts, not before
        threading.Thread(target=prune, args=(os.path.dirname(os.path.dirname(job)),
                                              args.keep, args.run), daemon=True).start()
    peers = Peers(ring)
    slurm = slurmjob.job_id()
    watch = slurmjob.Watch(slurm) if slurm else None
    why = ""
    reason: End | None = None
    left_to_controller: float | None = None  # since when (see TIMEOUT_DUMP_WAIT)
    dumped_at: float | None = None  # this hang's stacks are on the share (once a hang)
    dumping: threading.Thread | None = None  # the dump in progress: the beat goes on
    state = {"node": args.node, "user": getpass.getuser(), "state": "running",
             "pid": proc.pid, "started": time.time(), "ring_port": ring.port}
    statefile = StateFile(mine, ring.counters)
    statefile.put(state)
    ring.start()

    def tell() -> None:   # this node's state changed: the share and the ring
        statefile.put(state)
        ring.say(state="running", hang=state.get("hang"))

    looked = time.monotonic()
    first_beat = FirstBeat(os.path.join(job, OUTPUT_LOG)) if args.recovery else None
    while proc.poll() is None:
        quiet = _quiet_for(job)
        if first_beat is not None and first_beat.seen():
            state["first_beat"], first_beat = time.time(), None   # training again
            tell()
        ring.progress(quiet)
        if time.monotonic() - looked > HELD_UP:   # this process was held up, not its peers
            print(f"{time.strftime('%H:%M:%S')} this supervisor was held up for "
                  f"{time.monotonic() - looked:.0f} s: its peers get a fresh "
                  f"{PEER_TIMEOUT:g} s", flush=True)
            ring.forgive()
        looked = time.monotonic()
        if reason is None:
            found = peers.verdict()
            if found and found[0] == End.PEER_FAILED and args.attached \
                    and peers.timed_out(found[1]):
                # The controller dumps the ranks still running, then stops them: stopping
                # them here first would lose the rank that held the collective up.
                left_to_controller = left_to_controller or time.monotonic()
                if time.monotonic() - left_to_controller < TIMEOUT_DUMP_WAIT:
                    found = None
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
                dumped_at = dumping = None  # progress again (--on-hang wait): a later hang is new
                state.pop("hang", None)
                tell()
                _unlink(os.path.join(job, HANG_DUMPED))
            if hung and dumping is None:
                dumping = threading.Thread(target=_dump_hang, args=(args, quiet), daemon=True)
                dumping.start()
            if hung and dumped_at is None and dumping is not None and not dumping.is_alive():
                dumped_at = time.monotonic()
                state["hang"] = "dumped"
                tell()
                _touch(os.path.join(job, HANG_DUMPED))  # `follow` tells the controller
            if hung and stopping and dumped_at is not None and (
                    peers.all_dumped() or time.monotonic() - dumped_at > HANG_GATHER):
                reason, why = End.HUNG, (f"no rank made progress for {quiet:.0f} s "
                                         f"(--hang-timeout {args.hang_timeout:g})")
            elif hung:
                pass  # dumped; waiting for the peers' dumps (stop) or for progress (wait)
            elif found:
                reason, why = found[0], found[1]
            elif os.path.exists(os.path.join(job, STOP_REQUESTED)):
                reason = End.STOPPED
            elif args.attached and _lease_gone(job, args.lease_timeout):
                reason = End.CONTROLLER_LOST
            elif watch is not None and watch.over.is_set():
                reason, why = End.STOPPED, slurmjob.ended_why(watch.job)
            if reason and (reason != End.STOPPED or why):  # `stop` stops the tree itself
                threading.Thread(target=stop_tree, args=(job, args.run, args.grace),
                                 daemon=True).start()
        try:
            proc.wait(timeout=BEAT)
        except subprocess.TimeoutExpired:
            pass
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    if reason is None and os.path.exists(os.path.join(job, STOP_REQUESTED)):
        reason = End.STOPPED
    if reason is None and code != 0 and args.recovery:
        # The ranks here failed by themselves; when a peer died, its sockets broke first,
        # before its silence names it: a run that may recover waits for that name.
        lost = _lost_meanwhile(ring)
        if lost:
            reason, why = End.PEER_LOST, lost
    if reason is None and dumped_at is not None and args.on_hang == "stop":
        # Hung and dumped: a peer stopped first, and this node's ranks ended with it.
        reason, why = End.HUNG, f"no rank made progress (--hang-timeout {args.hang_timeout:g})"
    if reason is None and code != 0 and watch is not None and watch.look_now():
        # Slurm ended the job, and a peer that saw it first stopped its ranks: this node's
        # ranks failed with them before this node's own look at the job (every LOOK s).
        reason, why = End.STOPPED, slurmjob.ended_why(watch.job)
    final = {**state, "state": "ended", "code": code, "reason": (reason or End.EXITED).value,
             "why": why, "ended": time.time()}
    if reason is None and code != 0 and _timed_out(job):
        final["timed_out"] = True
    # The peers learn the end over the ring first: the share may be stalled.
    ring.last_word(**{k: final[k] for k in ("state", "code", "reason", "why")},
                   timed_out=bool(final.get("timed_out")))
    final["supervision"] = ring.counters.to_json()
    final["heard"] = ring.heard_at()   # when a node lost later was last heard (recovery)
    write_json(os.path.join(job, EXIT_FILE), final)
    statefile.close(final)
    if slurm:
        if watch is not None:
            watch.close()
        slurmjob.release(slurm, lambda: all_ended(state_dir, ring.names))
    if args.recovery and reason in (End.PEER_LOST, End.PEER_FAILED):
        from .recover import after_end  # a detached run that may recover: its next attempt
        after_end(state_dir, args.run, args.node, ring.names, reason, why,
                  ring.peers_status().get(why) or {}, final["heard"].get(why), args.argv[0])
    return 0


class FirstBeat:
    """Whether the job's output has shown its first beat yet (read on from where the
    last look stopped)."""

    def __init__(self, path: str) -> None:
        self.path, self.offset, self.rest = path, 0, b""

    def seen(self) -> bool:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(1 << 20)
        except OSError:
            return False
        self.offset += len(data)
        text, self.rest = self.rest + data, data[-len(BEAT_MARKER):]
        return BEAT_MARKER.encode() in text


def _lost_meanwhile(ring: Ring) -> str | None:
    """The peer the ring names lost within PEER_TIMEOUT (and a few beats), while this node
    goes on beating and says its torchrun failed; None at once when every peer's failed
    or ended too (the script failed everywhere: nobody's fault but its own)."""
    ring.say(state="running", failed=True)
    deadline = time.monotonic() + PEER_TIMEOUT + 3 * BEAT
    while time.monotonic() < deadline:
        ring.look()
        lost = ring.lost_peers()
        if lost:
            return sorted(lost)[0]
        known = ring.peers_status()
        if all((known.get(n) or {}).get("failed") or (known.get(n) or {}).get("state")
               == "ended" for n in ring.names if n != ring.me):
            return None
        time.sleep(BEAT)
    return None


def _timed_out(job: str) -> bool:
    """Whether the end of torchrun's output tells of a collective that timed out."""
    try:
        with open(os.path.join(job, OUTPUT_LOG), "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - TAIL_BYTES))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return False
    return COLLECTIVE_TIMEOUT.search(tail) is not None


def _quiet_for(job: str) -> float:
    """Seconds since the job last printed anything (a line, a beat, part of a line)."""
    try:
        return max(0.0, time.time() - os.stat(os.path.join(job, OUTPUT_LOG)).st_mtime)
    except OSError:
        return 0.0


def _dump_hang(args: argparse.Namespace, quiet: float) -> None:
    """Every worker's stack and flight recorder of this node, HANG_SAMPLES times a second
    apart (a rank that holds still in all of them is the one to name), for the run's
    record: on the share, STATE/hang/<node>.json, where the controller (attached) or
    `runs` (detached) reads them through any node. It runs beside the heartbeat."""
    into = os.path.join(args.state_dir, HANG_SUBDIR)
    print(f"{time.strftime('%H:%M:%S')} no rank made progress for {quiet:.0f} s: dumping "
          "this node's workers", flush=True)
    try:
        os.makedirs(into, exist_ok=True)
        samples = []
        for i in range(HANG_SAMPLES):
            if i:
                time.sleep(HANG_INTERVAL)
            samples.append(dump_workers(args.job, args.run, py_spy_for(args.argv[0]), False))
        write_json(os.path.join(into, f"{args.node}.json"),
                   {"node": args.node, "detected_at": time.time(), "quiet_s": round(quiet, 1),
                    "ranks": samples[0], "samples": samples})
    except OSError as exc:
        print(f"{time.strftime('%H:%M:%S')} hang dump not written: {exc}", flush=True)


def _touch(path: str) -> None:
    with open(path, "w") as fh:
        fh.write(f"{time.time()}\n")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _lease_gone(job: str, timeout: float, now: float | None = None) -> bool:
    """The attached controller is gone: silent for TIMEOUT, or its follower's input ended
    RECONNECT_GRACE ago and no follower renewed the lease since (a controller whose
    connection dropped connects again and renews it)."""
    now = time.time() if now is None else now
    try:
        renewed = os.stat(os.path.join(job, LEASE_FILE)).st_mtime
    except OSError:
        return True
    try:
        ended = os.stat(os.path.join(job, LEASE_LOST)).st_mtime
    except OSError:
        ended = None
    if ended is not None and ended >= renewed and now - ended > RECONNECT_GRACE:
        return True
    return now - renewed > timeout
