"""What the controller and the nodes agree on: how a node's part of a run ends, the words
of the launch's handshake and of the log stream, the files of a run on a node and on the
share, and the node-side defaults. Imported by both sides (standard library only).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum

# -- where a user's state lives on a node (relative to that user's home; mode 0700) --------
NODE_STATE_DIR = ".clustertrain"
CODE_SUBDIR = "code"    # code snapshots: code/<run>/, code/latest
JOBS_SUBDIR = "jobs"    # a run's job directory on this node: jobs/<run>/
LIB_SUBDIR = "lib"      # this package, one directory per version: lib/<version>/
ENVS_SUBDIR = "envs"    # a user's own environments: envs/NAME-KEY/, envs/NAME (the newest)
ENVS_DIR = f"{NODE_STATE_DIR}/{ENVS_SUBDIR}"   # relative to the user's home
# An environment's name (env create --name, train --python-env): also a file name there.
ENV_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"   # matched whole (fullmatch)
LAST_USED = "last-used"  # in an environment's directory: touched when a run checks it
JOBS_DIR = f"{NODE_STATE_DIR}/{JOBS_SUBDIR}"
# Master-port claims on node 0, any user's: a directory of root's like /tmp, made at boot
# (roles/common tasks/ports.yml: common_port_claims_dir), where no user can make it first.
PORT_CLAIMS_DIR = "/run/clustertrain-ports"

# -- the files of a run's job directory (~/.clustertrain/jobs/<run>/) -----------------------
OUTPUT_LOG = "output.log"          # torchrun's output (every rank's lines)
SUPERVISOR_LOG = "supervisor.log"  # the supervisor's own words
EXIT_FILE = "exit"                 # the node's end: JSON, as in its state
PGID_FILE = "pgid"                 # torchrun's process group
SUPERVISOR_PID = "supervisor.pid"
STOP_REQUESTED = "stop-requested"
NOTEBOOK_FILE = "notebook.json"    # a notebook's port and token (node/notebook.py)
NOTEBOOK_MODULE = "orchestrator.node.notebook"   # what a notebook's run runs (-m)
STOPPED_FILE = "stopped"
HANG_DUMPED = "hang-dumped"        # this node found the run hung and dumped its workers
LEASE_FILE = "lease"               # renewed by the attached controller's heartbeat
LEASE_LOST = "lease-lost"          # the controller's input ended
FR_SUBDIR = "fr"                   # the workers' flight-recorder pipes and dumps
TIMEOUT_DUMP_PREFIX = "timeout-rank"   # torch's own dump on a NCCL timeout: fr/<this>R
# -- on the share: STATE/<node>.json per node, STATE/hang/<node>.json when it hung -----------
HANG_SUBDIR = "hang"

# -- the launch's handshake (`supervise --wait-go`) and the log stream's end -----------------
READY = "@@clustertrain-ready"       # loaded, waiting for GO
GO = "go"   # GO's line: `go {"ports": ..., "key": ..., "env": ...}` (GoWord)
STARTED = "@@clustertrain-started"   # and the supervisor's PID, once detached
EXIT_MARKER = "@@clustertrain-exit"  # the last line of a node's log stream: code, end, why
HANG_MARKER = "@@clustertrain-hang"  # in a node's log stream: it found the run hung, dumped
# A line of JOB/output.log written just before the run's processes there are signalled to
# stop: what torchrun says after it is the stop's echo (kept in the log, not shown live).
STOP_MARKER = "@@clustertrain-stopping"
# A line of JOB/output.log the supervisor writes every SYSTEM_INTERVAL seconds while
# torchrun runs: the node's system metrics as one JSON object (node/sysmetrics.py). The
# controller keeps it in the run's timeline, never on the terminal nor as progress.
SYSTEM_MARKER = "@@clustertrain-system"
SYSTEM_INTERVAL = 10.0
# A line of JOB/output.log the supervisor writes when torchrun failed and its ranks' output
# says a disk was full: the fullest place the job wrote to, with its figures (space.py).
NO_SPACE_MARKER = "[clustertrain] out of space:"
# The worker runner's last line for a rank whose script finished.
FINISHED_MARKER = "[clustertrain] rank {rank} finished: exit code {code}"
FR_DIR_ENV = "CLUSTERTRAIN_FR_DIR"   # where a worker serves its flight recorder
RUN_ID_ENV = "CLUSTERTRAIN_RUN_ID"   # every process of a run carries it



@dataclass(frozen=True)
class GoWord:
    """What the launch's GO brings a supervisor on its standard input, the one way into a
    run that no other user can read (not a command line, not an environment): every
    node's ring port, the run's ring key (node/ring.py) and the values of the job's
    --secret-env variables."""
    key: bytes
    ports: dict[str, int] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        return f"{GO} " + json.dumps({"ports": self.ports, "key": self.key.hex(),
                                      "env": self.env}, separators=(",", ":")) + "\n"

    @classmethod
    def parse(cls, line: str) -> GoWord | None:
        """GO's line read back; None for anything else (the launch was called off)."""
        word, _, rest = line.strip().partition(" ")
        if word != GO:
            return None
        try:
            data = json.loads(rest)
            return cls(bytes.fromhex(data["key"]),
                       {str(n): int(p) for n, p in (data.get("ports") or {}).items()},
                       {str(k): str(v) for k, v in (data.get("env") or {}).items()})
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def parse_ports(ports: str) -> range:
    """'LOW-HIGH' (the cluster's ring ports: cluster_ring_ports) as a range; ValueError
    naming the form. The firewall role checks the same rule (cluster_contract.port_range:
    the node package cannot import it; a test holds the two together)."""
    low, sep, high = ports.partition("-")
    if not (sep and low.isdigit() and high.isdigit()
            and 1024 <= int(low) <= int(high) <= 65535):
        raise ValueError(f"ring ports {ports!r}: not LOW-HIGH with 1024 <= LOW <= HIGH <= "
                         "65535")
    return range(int(low), int(high) + 1)


# -- node-side defaults (the controller's options default to these) -------------------------
BEAT = 1.0            # seconds between heartbeats and checks
RING_KEY_BYTES = 32   # a run's ring key (ring.py: every beat's HMAC)
PEER_TIMEOUT = 15.0   # a peer not heard from over the network for this long is lost
BOUND_WAIT = 60.0     # a detached launch's port claim waits this long at most for torchrun
PEER_START = 120.0    # a peer never heard from within this long is lost
STATE_REFRESH = 10.0  # a running node's state file on the share is rewritten this often
STATE_STALE = 120.0   # `runs`: a running node's state file older than this: the node is lost
GRACE = 5.0           # seconds between SIGTERM and SIGKILL when a job is stopped
LEASE_TIMEOUT = 30.0  # an attached run whose controller is silent this long is stopped
# A node's connection that drops (no answer to SSH keepalives: a network blip, an sshd
# starved of CPU) gets a second look: the controller connects again for up to RECONNECT
# seconds and follows the node's log on from where it broke. The node keeps the lease that
# long after its follower's input ended (RECONNECT_GRACE): a controller that is really gone
# (killed with SIGKILL) is given up then.
RECONNECT = 10.0
RECONNECT_GRACE = RECONNECT + 5.0
# A worker's progress line (the job's heartbeat: train/beat.py prints it); the run's
# first one is its first training step (a detached recovery's nodes record when).
BEAT_MARKER = "##clustertrain beat"
# A detached run that may recover (`train --detach --max-recoveries N`): the nodes start
# the next attempt themselves (recover.py). The controller leaves the plan in the first
# attempt's state directory; a failed attempt's decision goes into its own.
RECOVERY_SUBDIR = "recovery"   # STATE/recovery/: plan.json (first attempt), next.json
PLAN_FILE = "plan.json"
NEXT_FILE = "next.json"
STANDBY_IDLE = 60.0   # a spare's standby leaves this long after the run's last end
DRAIN = "/usr/local/sbin/clustertrain-drain"   # roles/slurm's slurm_drain_command
# The placeholders of the plan's launch line (a node's shell line, as the controller
# would send it over SSH); each node fills them in for its part of the next attempt.
TEMPLATE = {name: f"@ct-{name}@" for name in (
    "run", "rank", "nnodes", "master", "node", "nodes", "addresses", "state", "home",
    "torchrun", "python", "attempt")}
KEEP_RUNS = 20        # snapshots and job directories kept per user and node
KEEP_ENVS = 3         # states of one environment kept per user and node (env create)
HANG_GATHER = 45.0    # seconds a node that dumped for a hang waits for its peers' dumps
HANG_SAMPLES = 3      # stack samples of every rank taken for a hang, a second apart
HANG_INTERVAL = 1.0
# An attached run: how long a node leaves a peer's collective timeout to the controller,
# which dumps the ranks still running (one of them held the others up) and then stops
# them; past it, the node stops its ranks itself.
TIMEOUT_DUMP_WAIT = 30.0

# A rank's collective timing out (gloo's words, NCCL's watchdog's). The supervisor marks
# its end with it ("timed_out"); the controller reads it in the node's last lines.
COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting \d+ms for \w+ operation|"
                                r"Watchdog caught collective operation timeout|"
                                r"ran for \d+ milliseconds before timing out")


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
    HUNG = "hung"                        # no rank made progress for --hang-timeout
    RUNNING = "running"
    LOST = "lost"

    def __str__(self) -> str:  # the value in f-strings and logs, on every Python 3
        return self.value

    @property
    def caused_elsewhere(self) -> bool:
        """Stopped for something outside this node (never its run's first failure)."""
        return self in (End.STOPPED, End.CONTROLLER_LOST, End.PEER_FAILED,
                        End.PEER_STOPPED, End.PEER_LOST, End.HUNG)


def read_end(value: object) -> End:
    """An End from what a node wrote (a value this version does not know: LOST)."""
    try:
        return End(value if value is not None else End.EXITED.value)
    except ValueError:
        return End.LOST
