"""The soak's workload: each action of a user (plan.py's USER_VERBS, ADMIN_VERBS and
ATTACKS) as the real command line that user runs, with that user's inventory and runs
directory, and how the executor runs it (in the background or not, for how long at most).

A run is named by the soak (`train --run-id`), from the seed and the action that starts it,
so that a later stop or attach, or the pusher's attack, names it before its record exists.
Where an action needs a choice the schedule does not make (the nodes of a run, the node to
cordon), it is drawn from the seed and the action's own name: the same seed, the same
command lines.

Standard library only: the mapping is tested without a cluster.
"""

from __future__ import annotations

import random
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .plan import Action

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "tests" / "orchestrator" / "jobs"
TRAIN = REPO / "train"
# train/train.py small enough for a soak (tests/orchestrator/run/test_real_site_sandbox.py).
SMALL = ("--width", "8", "--batch-size", "32", "--log-every", "10")
SHARE = "/mnt/cluster"   # the share on the nodes (layout.SHARED_PATH)
# What the pusher's attacks look for: another user's private places (tests/security/).
PRIVATE = ("{share}/checkpoints/{victim}", "{share}/checkpoints/{victim}/.clustertrain/runs",
           "/home/{victim}/.clustertrain")
READ = "READ "   # the attack's probe prints this before a path it could read


class NotImplementedYet(Exception):
    """The executor cannot do this action yet: recorded as an `info` event, listed in the
    report, never counted as passed."""


class NothingToAimAt(Exception):
    """The action needs something that is not there at its time (an attack on a victim
    with no live run, a kill -9 with no `train` running): recorded as an `info` event."""


@dataclass(frozen=True)
class Site:
    """What the commands need of the sandbox: each user's inventory and ssh_config, the
    training nodes, where the soak keeps the runs' records, and the seed."""
    inventories: dict[str, Path]
    ssh_configs: dict[str, Path]
    nodes: tuple[str, ...]
    runs: Path                      # a user's records go under runs/USER
    seed: int
    admin: str = "alice"
    python: str = field(default=sys.executable)

    def runs_dir(self, user: str) -> Path:
        return self.runs / user

    def run_id(self, ref: str) -> str:
        """The id the soak gives the run that the action REF starts (a run id of
        record/rundir.py: letters, digits, '.', '_', '-')."""
        return f"soak{self.seed}-{ref}"

    def rng(self, *parts: object) -> random.Random:
        """A random source of the seed and PARTS alone (not of the order things ran in)."""
        return random.Random("/".join(str(p) for p in (self.seed, *parts)))


@dataclass(frozen=True)
class Command:
    """A command line as USER runs it. BACKGROUND: the executor starts it and records its
    end when it comes (a train, an attach); TIMEOUT: the longest it may take before the
    executor ends it (a fail). RUN_ID: the run it starts or acts on; ATTACKS: the victim,
    for an attack."""
    user: str
    argv: tuple[str, ...]
    background: bool = False
    timeout: float = 300.0
    run_id: str = ""
    starts: bool = False            # it starts the run RUN_ID
    victim: str = ""
    hosts: tuple[str, ...] = ()

    def shown(self) -> str:
        """The command line as a person would type it (the repository's paths shortened)."""
        return " ".join(shlex.quote(a) for a in self.argv).replace(str(REPO) + "/", "")


def orchestrator(site: Site, *args: str) -> tuple[str, ...]:
    return (site.python, "-m", "orchestrator", *args)


def hosts_for(site: Site, action: Action) -> tuple[str, ...]:
    """The nodes a run starts on: its N of the training nodes, drawn from the seed and the
    action's ref (researchers do not all pile onto node0)."""
    count = max(1, min(int(action.args.get("nodes", 1)), len(site.nodes)))
    return tuple(sorted(site.rng("hosts", action.ref).sample(list(site.nodes), count)))


def seconds_for(site: Site, action: Action, low: float = 20.0, high: float = 90.0) -> int:
    """How long a run's job keeps running (ddp_allreduce.py --sleep), from the seed."""
    return round(site.rng("sleep", action.ref).uniform(low, high))


def train_command(action: Action, site: Site) -> Command:
    """A run-starting verb (plan.STARTS) as `train`: no --share-gpus (a node in use is
    refused, as a careful researcher's would be), a run id of the soak's."""
    user, verb = action.actor, action.verb
    run_id = site.run_id(action.ref)
    base = ("train", "-i", str(site.inventories[user]), "--runs-dir", str(site.runs_dir(user)),
            "--run-id", run_id)
    hosts = hosts_for(site, action)
    allreduce = ("--workdir", str(JOBS), "ddp_allreduce.py", "--", "--steps", "5",
                 "--sleep", str(seconds_for(site, action)), "--tick")
    checkpointed = ("--workdir", str(TRAIN), "train.py", "--", "--epochs", "2",
                    "--run-name", run_id, *SMALL)
    args: tuple[str, ...]
    if verb == "train":
        args = (*base, "--hosts", ",".join(hosts), *checkpointed)
        return Command(user, orchestrator(site, *args), background=True, timeout=900,
                       run_id=run_id, starts=True, hosts=hosts)
    if verb == "train-detach":
        args = (*base, "--hosts", ",".join(hosts), "--detach", *allreduce)
        return Command(user, orchestrator(site, *args), background=True, timeout=600,
                       run_id=run_id, starts=True, hosts=hosts)
    if verb == "train-queue":
        count = len(hosts)
        args = (*base, "--queue", "--nodes", str(count), "--gpus-per-node", "1", *allreduce)
        return Command(user, orchestrator(site, *args), background=True, timeout=900,
                       run_id=run_id, starts=True)
    if verb == "train-recover":
        spares = [n for n in site.nodes if n not in hosts][:1]
        recover = ("--max-recoveries", "1",
                   *(("--spare-hosts", spares[0]) if spares else ("--min-nodes", "1")))
        args = (*base, "--hosts", ",".join(hosts), "--detach", *recover, *checkpointed)
        return Command(user, orchestrator(site, *args), background=True, timeout=600,
                       run_id=run_id, starts=True, hosts=hosts)
    raise NotImplementedYet(f"{verb}: a run in the user's own environment needs "
                            "`env create` first (not done by the soak yet)")


def command_for(action: Action, site: Site, *, node: str = "", target: str = "") -> Command:
    """The command line of ACTION. NODE: the node a cordon or uncordon names (the executor
    chooses it: the admin lifts its own cordons); TARGET: the run an attack aims at (one of
    the victim's live runs). NotImplementedYet for what the executor cannot do yet."""
    user, verb = action.actor, action.verb
    inventory = str(site.inventories.get(user, ""))
    if verb in ("train", "train-detach", "train-queue", "train-recover", "train-own-env"):
        return train_command(action, site)
    if verb == "stop":
        run_id = site.run_id(action.ref)
        return Command(user, orchestrator(site, "stop", run_id, "--runs-dir",
                                          str(site.runs_dir(user)), "-i", inventory),
                       timeout=120, run_id=run_id)
    if verb == "attach":
        run_id = site.run_id(action.ref)
        return Command(user, orchestrator(site, "attach", run_id, "--runs-dir",
                                          str(site.runs_dir(user))),
                       background=True, timeout=600, run_id=run_id)
    if verb in ("du", "usage"):
        everyone = ("--all",) if user == site.admin else ()
        return Command(user, orchestrator(site, verb, "-i", inventory, *everyone), timeout=300)
    if verb == "cordon":
        why = f"soak seed {site.seed}: {user} takes it out for maintenance"
        return Command(user, orchestrator(site, "cordon", node or "node0", "--why", why, "-i",
                                          inventory), timeout=120)
    if verb == "uncordon":
        return Command(user, orchestrator(site, "uncordon", node or "node0", "-i", inventory),
                       timeout=120)
    if verb == "stop-anothers-run":
        victim = action.args["victim"]
        if not target:
            raise NothingToAimAt(f"{verb}: {victim} has no live run to aim at")
        return Command(user, orchestrator(site, "stop", target, "--runs-dir",
                                          str(site.runs_dir(victim)), "-i", inventory),
                       timeout=120, run_id=target, victim=victim)
    if verb == "read-anothers-checkpoints":
        victim = action.args["victim"]
        return Command(user, ssh(site, user, node or site.nodes[0], read_probe(victim)),
                       timeout=60, victim=victim)
    raise NotImplementedYet(f"{verb}: not implemented by the soak's executor yet")


def read_probe(victim: str) -> str:
    """Shell that tries to read VICTIM's private places on a node and prints READ and the
    path of each one it could list (nothing: every one refused)."""
    paths = " ".join(shlex.quote(p.format(share=SHARE, victim=victim)) for p in PRIVATE)
    return (f"for p in {paths}; do ls \"$p\" >/dev/null 2>&1 && echo \"{READ}$p\"; done; "
            f"for f in {SHARE}/checkpoints/{victim}/*/*.pt; do "
            f"[ -e \"$f\" ] && head -c 1 \"$f\" >/dev/null 2>&1 && echo \"{READ}$f\"; done; true")


def ssh(site: Site, user: str, node: str, command: str) -> tuple[str, ...]:
    """COMMAND on NODE over real SSH as USER (the sandbox's ssh_config of that user)."""
    return ("ssh", "-F", str(site.ssh_configs[user]), "-o", "BatchMode=yes", "-o",
            "ConnectTimeout=10", node, command)


def breached(command: Command, returncode: int, output: str) -> list[str]:
    """What an attack got that it must not: the paths it read, or the stop it was let do
    (an empty list: it was refused)."""
    if command.argv[-1:] and READ.strip() in output and command.argv[0] == "ssh":
        return [line[len(READ):] for line in output.splitlines() if line.startswith(READ)]
    if "stop" in command.argv and command.victim and returncode == 0:
        return [f"stop {command.run_id} of {command.victim} exited 0"]
    return []
