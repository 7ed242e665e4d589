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
- a run with a Slurm job cancels it once every node's part has ended;
- while torchrun runs, the node's system metrics (CPU, memory, the job's memory, the
  cluster interface's traffic, the GPUs) go into the job's output every SYSTEM_INTERVAL s
  (sysmetrics.py), lines that are not the job's progress;
- started by srun as a step of the run's Slurm job (--in-step), it stays in the foreground
  of its step, and SIGTERM (Slurm ending the job or the step) ends the run here at once.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import slurmjob, sysmetrics, torchrun
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
from .requests import Supervise
from .ring import Counters, Ring, read_state, resolve, ring_socket
from .space import out_of_space
from .statefile import StateFile
from .terminate import STARTING, STOP_SETTLE, stop_tree
from .usage import gpus_used
from .util import detach, read_json, read_pid, redirect, tail_text, write_json

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
        """A peer found the run hung and dumped its workers (see Hang)."""
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


def node_states(state_dir: str, names: list[str]) -> list[dict | None]:
    """Every node's state file, read now (None: none, or not one)."""
    states = [read_json(os.path.join(state_dir, f"{n}.json")) for n in names]
    return [s if isinstance(s, dict) else None for s in states]


def all_ended(state_dir: str, names: list[str]) -> bool:
    """Every node's state file, read now, says its part has ended."""
    return all((s or {}).get("state") == "ended" for s in node_states(state_dir, names))


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


def run(args: Supervise) -> int:
    """Supervise the run (see _supervise); whatever goes wrong, the run ends with an exit
    status: a supervisor that died silently would leave its followers waiting forever.
    With --wait-go, first the launch's handshake (await_go), which brings the run's ring
    key; without, the key is read from --key-file (a supervisor started by hand)."""
    names = list(args.nodes)
    addresses = resolve(names, list(args.addresses))
    # Before READY: its port goes to the peers with GO.
    sock = ring_socket(addresses, parse_ports(args.ring_ports) if args.ring_ports else None)
    if args.wait_go:
        go = await_go(args.job, args.cwd, sock.getsockname()[1], args.in_step)
        if go is None:
            return 0
    else:
        go = GoWord(read_key(args.key_file, alone=len(names) == 1))
        if args.cwd:
            os.chdir(args.cwd)
    ring = Ring(args.run, args.node, names, addresses,
                lambda name: read_state(args.state_dir, name), Counters(), go.key,
                sock=sock, ports=go.ports)
    terminated = threading.Event()
    if args.in_step:   # Slurm ends a step with SIGTERM: the run ends here, saying why
        signal.signal(signal.SIGTERM, lambda _signum, _frame: terminated.set())
    try:
        return _supervise(args, ring, go.env, terminated)
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


def await_go(job: str, cwd: str | None, ring_port: int,
             in_step: bool = False) -> GoWord | None:
    """The launch's two phases, so that torchrun starts on every node at once: loaded
    (Python's start and imports are most of what a launch costs a node), say READY and
    this node's ring port on standard output and wait for GO on standard input, which
    brings every node's ring port (the peers' beats need no share to find each other), the
    run's ring key and the job's secret variables (protocol.GoWord); then go to CWD (the
    code snapshot, synced meanwhile) and say STARTED with the supervisor's PID (also in
    JOB/supervisor.pid), whose output goes to JOB/supervisor.log from then on. Over SSH,
    the supervisor detaches first, into a session of its own; IN_STEP (a step of the run's
    Slurm job, started by srun) it goes on as it is: the step lasts as long as this process.
    None if the launch was called off first (end of input): nothing was started."""
    print(f"{READY} {ring_port}", flush=True)
    go = GoWord.parse(sys.stdin.readline())
    if go is None:
        return None
    if cwd:
        os.chdir(cwd)  # a snapshot that is not there fails the launch, with its path
    log = os.path.join(job, SUPERVISOR_LOG)
    if in_step:
        _started(job, os.getpid())
        redirect(log)
        return go
    pid = detach(log)
    if pid:
        _started(job, pid)
        os._exit(0)
    return go


def _started(job: str, pid: int) -> None:
    with open(os.path.join(job, SUPERVISOR_PID), "w") as fh:
        fh.write(f"{pid}\n")
    print(f"{STARTED} {pid}", flush=True)


def _failed(args: Supervise, why: str, ring: Ring) -> None:
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
    ring.close()
    slurm = slurmjob.job_id()
    if slurm:   # the run has failed (its peers stop too): its Slurm job goes now
        slurmjob.release(slurm, lambda: True, lambda: 1)


def _append(path: str, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


@dataclass(frozen=True)
class Ending:
    """Why this node's part of the run ends, and the word that goes with it (the peer's
    name, Slurm's reason, the hang's numbers; often none)."""
    reason: End
    why: str = ""

    @property
    def stops_tree(self) -> bool:
        """This supervisor stops torchrun's tree for it: all but a plain stop request
        (`stop` stops the tree itself)."""
        return self.reason != End.STOPPED or bool(self.why)


def _first(*checks: Callable[[], Ending | None]) -> Ending | None:
    """The first ending of CHECKS, tried in order (each only if none before found one)."""
    for check in checks:
        ending = check()
        if ending is not None:
            return ending
    return None


def _supervise(args: Supervise, ring: Ring, secret_env: dict[str, str],
               terminated: threading.Event) -> int:
    """Start torchrun, watch it tick by tick until it ends (Supervisor.watch), and record
    how this node's part ended (Supervisor.conclude)."""
    os.makedirs(args.state_dir, exist_ok=True)
    if args.attached:
        open(os.path.join(args.job, LEASE_FILE), "w").close()
    if os.path.exists(os.path.join(args.job, STOP_REQUESTED)):
        _stopped_before_start(args)   # the launch failed on another node
        return 0
    supervisor = Supervisor(args, ring, _start(args, secret_env), terminated)
    try:
        during = supervisor.watch()
    finally:
        supervisor.sampling.set()   # no sample of a node whose torchrun has ended
    code = supervisor.proc.returncode
    code = code if code >= 0 else 128 - code
    if code != 0:   # a full disk, said where the controller reads it (before the end)
        note = out_of_space(os.path.join(args.job, OUTPUT_LOG), args.state_dir)
        if note:
            _append(os.path.join(args.job, OUTPUT_LOG), note + "\n")
    supervisor.conclude(code, during or supervisor.final_ending(code))
    return 0


def _stopped_before_start(args: Supervise) -> None:
    """Stopped before torchrun started: the node's state and exit say so."""
    final = {"node": args.node, "user": getpass.getuser(), "state": "ended",
             "code": 0, "reason": End.STOPPED.value, "why": "", "ended": time.time(),
             "time": time.time()}
    write_json(os.path.join(args.state_dir, f"{args.node}.json"), final)
    write_json(os.path.join(args.job, EXIT_FILE), final)


def _entry() -> str:
    """node.py beside this package (~/.clustertrain/lib/<version>/node.py on a node; in a
    checkout, where there is none, torchrun is started as it is: torchrun.command)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "node.py")


def _start(args: Supervise, secret_env: dict[str, str]) -> subprocess.Popen:
    """torchrun in a session of its own, its output in JOB/output.log, its process group
    in JOB/pgid; old runs' files are pruned while it starts, not before, and on node 0 the
    user's runs on the share that ended long ago are folded into their usage ledger
    (fold.py)."""
    job = args.job
    os.makedirs(os.path.join(job, FR_SUBDIR), exist_ok=True)  # torch's timeout dumps too
    with open(os.path.join(job, OUTPUT_LOG), "ab") as out:
        # The job's secret variables reach torchrun and its workers in their environment
        # (which only this user and root can read), never on a command line.
        proc = subprocess.Popen(torchrun.command(list(args.rest), _entry()),
                                stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **secret_env} if secret_env else None)
    with open(os.path.join(job, PGID_FILE), "w") as fh:
        fh.write(f"{proc.pid}\n")
    if args.keep_runs:
        threading.Thread(target=prune, args=(os.path.dirname(os.path.dirname(job)),
                                              args.keep_runs, args.run), daemon=True).start()
    if args.nodes and args.node == args.nodes[0]:   # the user's old records on the share
        threading.Thread(target=_fold, args=(args.state_dir,), daemon=True).start()
    return proc


def _fold(state_dir: str) -> None:
    """The user's old records folded (fold.py, imported here: not on the launch's way)."""
    from .fold import fold_quietly
    fold_quietly(state_dir)


class Supervisor:
    """One node's watch over its running torchrun: a decision each tick (BEAT) on whether
    the run must end here, the reason torchrun ended once it has, and the record of it."""

    def __init__(self, args: Supervise, ring: Ring, proc: subprocess.Popen,
                 terminated: threading.Event | None = None) -> None:
        self.args, self.job, self.ring, self.proc = args, args.job, ring, proc
        self.terminated = terminated or threading.Event()   # SIGTERM came (a Slurm step)
        self.peers = Peers(ring)
        self.slurm = slurmjob.job_id()
        self.slurm_watch = slurmjob.Watch(self.slurm) if self.slurm else None
        self.left_to_controller: float | None = None  # since when (see TIMEOUT_DUMP_WAIT)
        self.hang = Hang(args, self.peers, self._say_hang)
        self.state: dict[str, Any] = {
            "node": args.node, "user": getpass.getuser(), "state": "running",
            "pid": proc.pid, "started": time.time(), "ring_port": ring.port,
            "gpus": gpus_used(list(args.rest)),   # for `usage`'s GPU-hours
            "gpu_idle_s": 0.0}   # ... and its idle ones (_count_idle)
        self.statefile = StateFile(os.path.join(args.state_dir, f"{args.node}.json"),
                                   ring.counters)
        self.statefile.put(self.state)
        ring.start()
        self.first_beat = FirstBeat(os.path.join(self.job, OUTPUT_LOG)) \
            if args.recovery else None
        self.output = sysmetrics.OutputLines(os.path.join(self.job, OUTPUT_LOG))
        self.idle = sysmetrics.IdleGpus()
        self.sampling = sysmetrics.start(proc.pid, ring.addresses.get(args.node), self.output,
                                         seen=self._count_idle)

    def _count_idle(self, sample: dict) -> None:
        """The run's GPUs' idle time, in the node's state for `usage` (written with it)."""
        self.state["gpu_idle_s"] = round(self.idle.add(sample), 1)

    def _tell(self) -> None:
        """This node's state changed: the share and the ring."""
        self.statefile.put(self.state)
        self.ring.say(state="running", hang=self.state.get("hang"))

    def _say_hang(self, hang: str | None) -> None:
        if hang is None:
            self.state.pop("hang", None)
        else:
            self.state["hang"] = hang
        self._tell()

    # -- while torchrun runs ----------------------------------------------------------
    def watch(self) -> Ending | None:
        """Tick until torchrun ends; the ending decided meanwhile (torchrun's tree was
        stopped for it), or None."""
        ending: Ending | None = None
        stopping: threading.Thread | None = None
        looked = time.monotonic()
        while self.proc.poll() is None:
            quiet = _quiet_for(self.job, self.output)
            self._note_first_beat()
            self.ring.progress(quiet)
            looked = self._forgive_if_held_up(looked)
            if ending is None:
                ending = self._tick(quiet)
                if ending is not None and ending.stops_tree:
                    stopping = threading.Thread(target=stop_tree, daemon=True, args=(
                        self.job, self.args.run, self.args.grace))
                    stopping.start()
            try:
                self.proc.wait(timeout=BEAT)
            except subprocess.TimeoutExpired:
                pass
        if stopping is not None:
            # torchrun ended first; its workers, in sessions of their own, may not have:
            # the end is recorded once the stop has ended (or killed) every one of them.
            stopping.join(timeout=STARTING + self.args.grace + STOP_SETTLE)
        return ending

    def _note_first_beat(self) -> None:
        if self.first_beat is not None and self.first_beat.seen():
            self.state["first_beat"], self.first_beat = time.time(), None  # training again
            self._tell()

    def _forgive_if_held_up(self, looked: float) -> float:
        """A tick that came late: this process was held up, not its peers."""
        late = time.monotonic() - looked
        if late > HELD_UP:
            print(f"{time.strftime('%H:%M:%S')} this supervisor was held up for "
                  f"{late:.0f} s: its peers get a fresh {PEER_TIMEOUT:g} s", flush=True)
            self.ring.forgive()
        return time.monotonic()

    def _tick(self, quiet: float) -> Ending | None:
        """Whether the run must end here now. SIGTERM to a supervisor in a Slurm step
        (Slurm is ending it) ends it at once; else a hang comes first, and while this
        node dumps and gathers its peers' dumps, nothing else ends it; then, in order: a
        peer's word, a stop request, the controller's lease, the Slurm job."""
        if self.terminated.is_set():   # Slurm is ending this step: its word first
            return self._slurm_ended()
        found = self._peers_ending()
        if self.hang.holds(found, quiet):
            return self.hang.ending(quiet)
        return _first(lambda: found, self._stop_requested, self._controller_lost,
                      self._slurm_ended)

    def _peers_ending(self) -> Ending | None:
        found = self.peers.verdict()
        if found is None:
            return None
        if found[0] == End.PEER_FAILED and self.args.attached \
                and self.peers.timed_out(found[1]):
            # The controller dumps the ranks still running, then stops them: stopping
            # them here first would lose the rank that held the collective up.
            self.left_to_controller = self.left_to_controller or time.monotonic()
            if time.monotonic() - self.left_to_controller < TIMEOUT_DUMP_WAIT:
                return None
        return Ending(*found)

    def _stop_requested(self) -> Ending | None:
        if os.path.exists(os.path.join(self.job, STOP_REQUESTED)):
            return Ending(End.STOPPED)
        return None

    def _controller_lost(self) -> Ending | None:
        if self.args.attached and _lease_gone(self.job, self.args.lease_timeout):
            return Ending(End.CONTROLLER_LOST)
        return None

    def _slurm_ended(self) -> Ending | None:
        """The run's Slurm job is over (seen by the watch; or, SIGTERM having come to this
        step, seen now), or this step alone was ended (SIGTERM, the job goes on)."""
        watch = self.slurm_watch
        if watch is not None and (watch.over.is_set()
                                  or (self.terminated.is_set() and watch.look_now())):
            return self._job_over(watch.job)
        if self.terminated.is_set():
            return Ending(End.STOPPED, "its Slurm step was ended (SIGTERM)")
        return None

    # -- once torchrun has ended --------------------------------------------------------
    def final_ending(self, code: int) -> Ending | None:
        """Why torchrun ended, when nothing was decided while it ran (tried in order):
        Slurm ending this step (SIGTERM); a stop request; a peer lost meanwhile (its
        ranks' sockets broke first); a hang this node dumped for; the Slurm job ended.
        None: torchrun ended by itself."""
        failed = code != 0
        return _first(lambda: self._slurm_ended() if self.terminated.is_set() else None,
                      self._stop_requested,
                      lambda: self._peer_lost_meanwhile() if failed else None,
                      self.hang.ended_here,
                      lambda: self._slurm_ended_at_last() if failed else None)

    def _peer_lost_meanwhile(self) -> Ending | None:
        # The ranks here failed by themselves; when a peer died, its sockets broke first,
        # before its silence names it: a run that may recover waits for that name.
        lost = _lost_meanwhile(self.ring) if self.args.recovery else None
        return Ending(End.PEER_LOST, lost) if lost else None

    def _slurm_ended_at_last(self) -> Ending | None:
        # Slurm ended the job, and a peer that saw it first stopped its ranks: this node's
        # ranks failed with them before this node's own look at the job (every LOOK s).
        watch = self.slurm_watch
        if watch is not None and watch.look_now():
            return self._job_over(watch.job)
        return None   # SIGTERM to this step: final_ending asked _slurm_ended first

    def _job_over(self, job: str) -> Ending:
        """Why the run ends here now that Slurm ended its JOB: an attached run's train went
        away (its followers' input ended: killed, its connection lost), and its job was
        cancelled because of it (node/allocate.py), before the lease's grace named that;
        else Slurm's own end (scancel, its time limit)."""
        if self.args.attached and _input_ended(self.job):
            return Ending(End.CONTROLLER_LOST,
                          f"its train went away, and its Slurm job {job} with it")
        return Ending(End.STOPPED, slurmjob.ended_why(job))

    def conclude(self, code: int, ending: Ending | None) -> None:
        """Record the end: over the ring first (the share may be stalled), then the exit
        file and the node's state; then the Slurm job's release and, for a run that may
        recover from a peer's fault, its next attempt."""
        reason, why = (ending.reason, ending.why) if ending else (End.EXITED, "")
        final = {**self.state, "state": "ended", "code": code, "reason": reason.value,
                 "why": why, "ended": time.time()}
        if ending is None and code != 0 and _timed_out(self.job):
            final["timed_out"] = True
        self.ring.last_word(**{k: final[k] for k in ("state", "code", "reason", "why")},
                            timed_out=bool(final.get("timed_out")))
        final["supervision"] = self.ring.counters.to_json()
        final["heard"] = self.ring.heard_at()  # when a node lost later was last heard
        write_json(os.path.join(self.job, EXIT_FILE), final)
        self.statefile.close(final)
        self.ring.close()
        names = self.ring.names
        if self.slurm:
            if self.slurm_watch is not None:
                self.slurm_watch.close()
            slurmjob.release(self.slurm, lambda: all_ended(self.args.state_dir, names),
                             lambda: slurmjob.outcome(node_states(self.args.state_dir, names)))
        if self.args.recovery and reason in (End.PEER_LOST, End.PEER_FAILED):
            from .recover import after_end  # a detached run that may recover: its next try
            after_end(self.args.state_dir, self.args.run, self.args.node, names, reason, why,
                      self.ring.peers_status().get(why) or {}, final["heard"].get(why),
                      self.args.rest[0])


class Hang:
    """This node's part in a hang (no node made progress for --hang-timeout). Every node
    dumps its workers first and says so in its state; with --on-hang stop, a node stops
    only once every peer has dumped (or HANG_GATHER passed), or its stop would end the
    others' ranks before they are dumped. A peer's word starts this node's dump; progress
    again (--on-hang wait) ends the hang, and a later one is new."""

    def __init__(self, args: Supervise, peers: Peers,
                 say: Callable[[str | None], None]) -> None:
        self.args, self.peers, self.say = args, peers, say
        self.stopping = args.on_hang == "stop"
        self.dumping: threading.Thread | None = None  # the dump in progress: beats go on
        self.dumped_at: float | None = None  # this hang's stacks are on the share

    def holds(self, found: Ending | None, quiet: float) -> bool:
        """Whether the run is hung now (FOUND: the peers' word this tick); a hang dumped
        for ends here when the run made progress again."""
        timeout = self.args.hang_timeout
        hung = timeout > 0 and (
            found.reason == End.HUNG if found is not None
            else (min(quiet, self.peers.quiet() or 0.0) >= timeout
                  or (self.stopping and self.peers.any_dumped())))
        if not hung and quiet < timeout and self.dumped_at is not None:
            self.dumped_at = self.dumping = None
            self.say(None)
            _unlink(os.path.join(self.args.job, HANG_DUMPED))
        return hung

    def ending(self, quiet: float) -> Ending | None:
        """Hung: dump this node's workers (once), say it is dumped, and with --on-hang
        stop, the end once the peers' dumps are in; None until then (or, --on-hang wait,
        until progress)."""
        if self.dumping is None:
            self.dumping = threading.Thread(target=_dump_hang, args=(self.args, quiet),
                                            daemon=True)
            self.dumping.start()
        if self.dumped_at is None and not self.dumping.is_alive():
            self.dumped_at = time.monotonic()
            self.say("dumped")
            _touch(os.path.join(self.args.job, HANG_DUMPED))  # `follow` tells the controller
        if self.stopping and self.dumped_at is not None and (
                self.peers.all_dumped() or time.monotonic() - self.dumped_at > HANG_GATHER):
            return Ending(End.HUNG, f"no rank made progress for {quiet:.0f} s "
                                    f"(--hang-timeout {self.args.hang_timeout:g})")
        return None

    def ended_here(self) -> Ending | None:
        """Hung and dumped: a peer stopped first, and this node's ranks ended with it."""
        if self.dumped_at is not None and self.stopping:
            return Ending(End.HUNG, "no rank made progress "
                                    f"(--hang-timeout {self.args.hang_timeout:g})")
        return None


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
    return COLLECTIVE_TIMEOUT.search(tail_text(os.path.join(job, OUTPUT_LOG))) is not None


def _quiet_for(job: str, own: sysmetrics.OutputLines | None = None) -> float:
    """Seconds since the job last printed anything (a line, a beat, part of a line); the
    supervisor's OWN lines (system metrics) are not the job's."""
    try:
        st = os.stat(os.path.join(job, OUTPUT_LOG))
        return max(0.0, time.time() - (own.last_output(st) if own else st.st_mtime))
    except OSError:
        return 0.0


def _dump_hang(args: Supervise, quiet: float) -> None:
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
            samples.append(dump_workers(args.job, args.run, py_spy_for(args.rest[0]), False))
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


def _input_ended(job: str) -> bool:
    """The attached controller's follower lost its input, and no follower renewed the
    lease since."""
    try:
        return os.stat(os.path.join(job, LEASE_LOST)).st_mtime >= \
            os.stat(os.path.join(job, LEASE_FILE)).st_mtime
    except OSError:
        return False


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
