"""The soak's schedule, from its seed alone: what each user does and when, the faults the
nemesis injects, and the attacks of the user who pushes. The same seed gives the same
schedule, so that a violation is reproduced by running its seed again.

Users: the admin (re-runs site.yml with a changed environment file, cordons and lifts),
the researchers (every verb a user has), and one of them who pushes (the attacks
tests/security/ knows, against the others' runs while they train). A run a later action
refers to (stop, attach) is named by the action that started it (`ref`), since its id is
known only when it runs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

# A researcher's verbs, with how often each is chosen (weights).
USER_VERBS: dict[str, int] = {
    "train": 6,                 # attached, to its end
    "train-detach": 4,          # detached, followed by nobody
    "train-queue": 5,           # through Slurm's queue
    "train-recover": 3,         # detached, --max-recoveries 1
    "train-own-env": 2,         # in the user's own environment
    "sweep": 2,                 # with early stopping
    "notebook": 1,              # left idle until its idle limit
    "env-create": 1,
    "env-rm": 1,
    "stop": 2,                  # one of the user's own runs
    "attach": 2,                # one of the user's own detached runs
    "du": 1,
    "usage": 1,
    "ui": 1,                    # the web view's pages
}
ADMIN_VERBS: dict[str, int] = {"site-yml-new-env": 1, "cordon": 2, "uncordon": 2, "usage": 1}
# The nemesis's faults, each healed by itself or by its "heal" event.
FAULTS = ("kill-node", "stall-share", "fill-tmp", "gpu-xid", "kill-train-9",
          "cut-node-off", "restart-slurmctld")
# What the pushing user tries against another user's run (tests/security/ knows each).
ATTACKS = ("stop-anothers-run", "read-anothers-checkpoints", "answer-anothers-preflight",
           "claim-anothers-port", "drain-anothers-node", "bill-anothers-usage",
           "flood-cordons", "swap-a-symlink-under-du")
STARTS = ("train", "train-detach", "train-queue", "train-recover", "train-own-env")


@dataclass(frozen=True)
class Action:
    t: float                    # seconds since the soak began
    actor: str                  # a user, or "nemesis"
    verb: str                   # USER_VERBS, ADMIN_VERBS, FAULTS or ATTACKS
    args: dict[str, Any] = field(default_factory=dict)
    ref: str = ""               # a name for the run it starts, or the run it acts on


@dataclass(frozen=True)
class Cast:
    """Who acts: ADMIN, RESEARCHERS (PUSHER among them)."""
    admin: str = "alice"
    researchers: tuple[str, ...] = ("bob", "carol", "dave")
    pusher: str = "bob"

    def __post_init__(self) -> None:
        if len(self.researchers) < 3 or self.pusher not in self.researchers:
            raise ValueError("a soak needs at least three researchers, the pusher one of them")


def plan(seed: int, seconds: float, cast: Cast = Cast(), every: float = 40.0,
         fault_every: float = 150.0, attack_every: float = 120.0) -> list[Action]:
    """The schedule of SECONDS from SEED: each researcher acts about EVERY seconds, the
    admin a quarter as often, a fault about every FAULT_EVERY seconds (each kind of FAULTS
    in turn first, then at random), an attack about every ATTACK_EVERY seconds."""
    rng = random.Random(seed)
    actions: list[Action] = []
    for user in cast.researchers:
        actions += _acts(rng, user, USER_VERBS, seconds, every, others=[
            u for u in cast.researchers if u != user])
    actions += _acts(rng, cast.admin, ADMIN_VERBS, seconds, every * 4, others=[])
    actions += _faults(rng, seconds, fault_every)
    t = rng.uniform(attack_every / 2, attack_every)
    while t < seconds:
        victim = rng.choice([u for u in cast.researchers if u != cast.pusher])
        actions.append(Action(round(t, 1), cast.pusher, rng.choice(ATTACKS),
                              {"victim": victim}))
        t += rng.expovariate(1 / attack_every)
    return sorted(actions, key=lambda a: (a.t, a.actor))


def _acts(rng: random.Random, user: str, verbs: dict[str, int], seconds: float,
          every: float, others: list[str]) -> list[Action]:
    """USER's actions: verbs by their weights, exponential gaps of mean EVERY; stop and
    attach name one of the user's own earlier runs (none yet: a train instead)."""
    names, weights = list(verbs), list(verbs.values())
    started: list[str] = []
    detached: list[str] = []
    out = []
    t = rng.uniform(0, every)
    while t < seconds:
        verb = rng.choices(names, weights)[0]
        if verb in ("stop", "attach") and not (started if verb == "stop" else detached):
            verb = "train"
        ref = ""
        if verb in STARTS:
            ref = f"{user}-{len(started) + 1}"
            started.append(ref)
            if verb in ("train-detach", "train-recover"):
                detached.append(ref)
        elif verb == "stop":
            ref = rng.choice(started)
        elif verb == "attach":
            ref = rng.choice(detached)
        args = {"nodes": rng.choice((1, 2, 3))} if verb in STARTS else {}
        out.append(Action(round(t, 1), user, verb, args, ref))
        t += rng.expovariate(1 / every)
    return out


def _faults(rng: random.Random, seconds: float, every: float) -> list[Action]:
    """A fault about every EVERY seconds: each kind once, in an order of the seed's, then
    kinds at random; each on a node of the seed's choosing, for a while."""
    kinds = list(FAULTS)
    rng.shuffle(kinds)
    out = []
    t = rng.uniform(every / 2, every)
    while t < seconds:
        kind = kinds.pop(0) if kinds else rng.choice(FAULTS)
        out.append(Action(round(t, 1), "nemesis", kind,
                          {"node": f"node{rng.randrange(4)}",
                           "for_s": round(rng.uniform(10, 60))}))
        t += rng.expovariate(1 / every)
    return out
