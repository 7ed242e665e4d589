"""Recovery from a failed node (`train --max-recoveries N`): which ends are a node's fault
and start the run again, which nodes the next attempt runs on, and the story each
recovery leaves in the record (pure: the lifecycle runs the attempts).

An attempt is a run of its own (its record `RUN`, then `RUN.r1`, `RUN.r2`, ...: its own
logs, summary and node states), started from the same spec with the same checkpoint
directory and CLUSTERTRAIN_RECOVERY=<n>; the job resumes from its newest whole
checkpoint. A failed attempt's summary names the attempt that followed it
(`recovered_in`); the last attempt's summary lists every recovery.

A node's fault is decided by the node package's rule (node/fault.py), the one the nodes
use to recover a detached run: it was lost, its supervisor failed, or its torchrun or one
of its ranks was killed by a signal that was not a stop. Anything else is the script's:
an exception (the same on every rank, or on one), an exit code it chose; then, and for a
run that was stopped, interrupted or hung, nothing is retried.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import InputError, LaunchError
from ..node.fault import node_fault, ranks_killed
from ..node.protocol import TEMPLATE, End
from ..node.recover import attempt_dir
from ..record.rundir import iso
from .command import NodeCommand

RECOVERY_ENV = "CLUSTERTRAIN_RECOVERY"   # each attempt's number: 0, then 1, 2, ...
# The project's job says where it resumed from (train/train.py).
RESUMED = re.compile(r"resumed from (?P<checkpoint>\S+) in (?P<load_s>[\d.]+) s: epoch "
                     r"(?P<epoch>\d+), step \d+ \(global step (?P<step>\d+)\)")


def attempt_id(run_id: str, attempt: int) -> str:
    return run_id if attempt == 0 else f"{run_id}.r{attempt}"


@dataclass(frozen=True)
class Failure:
    """The node an attempt failed by, why, and when the failure was seen."""
    run_id: str
    node: str
    why: str
    lost: bool
    at: str    # ISO time: the failed node's end (its last word, for a lost node)


def node_failure(summary: Mapping[str, Any]) -> Failure | None:
    """The node fault that ended this attempt (node/fault.py), or None when it was not
    one (it succeeded, the script failed by itself, it was stopped, interrupted or hung)."""
    if summary.get("status") != "failed" or not summary.get("first_failed"):
        return None
    name = summary["first_failed"]
    node: Mapping[str, Any] = next(
        (n for n in summary.get("nodes") or [] if n.get("name") == name), {})
    reason = node.get("end_reason")
    why = node_fault(reason, node.get("why") or "", node.get("exit_code")) or ranks_killed(
        (summary.get("rank_exit_codes") or {}).get(name) or {})
    if why is None:
        return None
    return Failure(summary["run_id"], name, why, reason == End.LOST, str(summary.get("end")))


def next_nodes(names: Sequence[str], failed: str, spares: list[str],
               min_nodes: int | None) -> tuple[list[str], str | None]:
    """The nodes of the next attempt: the healthy ones in their order, then the first
    spare in the failed node's place (taken from SPARES); without a spare, the healthy
    ones alone when they are MIN_NODES or more. LaunchError when neither."""
    healthy = [n for n in names if n != failed]
    if spares:
        spare = spares.pop(0)
        return [*healthy, spare], spare
    if min_nodes is not None and len(healthy) >= min_nodes:
        return healthy, None
    raise LaunchError(
        f"{failed} failed and no spare node is left to take its place"
        + (f", and {len(healthy)} healthy node(s) are fewer than --min-nodes {min_nodes}"
           if min_nodes is not None else "")
        + ": hold spares ready (--spares K, --spare-hosts a,b), or allow fewer nodes "
        "(--min-nodes M, when the script accepts another world size)")


def spares_of(all_names: Sequence[str], chosen: Sequence[str], count: int,
              hosts: Sequence[str] | None, inventory: Path,
              min_nodes: int | None = None) -> list[str]:
    """The spare nodes, checked: COUNT nodes after the chosen ones in the inventory's
    order, or HOSTS; none of them a node of the run. MIN_NODES, checked too: fewer than
    the run's nodes (a recovery without a spare has one node less)."""
    if min_nodes is not None and min_nodes >= len(chosen):
        raise InputError(f"--min-nodes {min_nodes}: the run has {len(chosen)} node(s), so a "
                         f"recovery without a spare has {len(chosen) - 1} at most; give at "
                         f"most {len(chosen) - 1}, or leave it out (recover on a spare only)")
    if hosts:
        unknown = [h for h in hosts if h not in all_names]
        if unknown:
            raise InputError(f"--spare-hosts {','.join(hosts)}: {', '.join(unknown)} is not "
                              f"a node of {inventory} ({', '.join(all_names)})")
        mine = [h for h in hosts if h in chosen]
        if mine:
            raise InputError(f"--spare-hosts: {', '.join(mine)} is one of the run's own nodes "
                              f"({', '.join(chosen)}); a spare is a node the run does not use")
        return list(hosts)
    rest = [n for n in all_names if n not in chosen]
    if count > len(rest):
        raise InputError(f"--spares {count}: {inventory} has {len(rest)} node(s) besides the "
                          f"run's {', '.join(chosen)}; give at most {len(rest)}, or add nodes")
    return rest[:count]


@dataclass
class Recovery:
    """One recovery, as summary.json and `runs show` give it."""
    attempt: int                 # the attempt it started: 1, 2, ...
    failed_run: str              # the attempt that failed
    node: str
    why: str
    failed_at: str               # when the failure was seen (ISO)
    run_id: str                  # the attempt it started
    nodes: list[str]
    spare: str | None
    cordoned: bool
    last_heard_at: str | None = None      # when a lost node was last heard (ISO)
    started_at: str | None = None         # the new attempt's launch (ISO)
    training_again_at: str | None = None  # its first training step (a beat)
    down_s: float | None = None           # failed_at -> training again
    silent_s: float | None = None         # last_heard_at -> training again (a lost node)
    restart_s: float | None = None        # failed_at -> torchrun started again
    resume_s: float | None = None         # torchrun started -> first step (load included)
    load_s: float | None = None           # the checkpoint's load (the project's job)
    resumed_from: dict[str, Any] | None = None   # checkpoint, epoch, step
    steps_lost: int | None = None         # steps done after that checkpoint, done again

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def complete(self, summary: Mapping[str, Any], log_text: str,
                 last_step: int | None) -> None:
        """Fill in what the new attempt's end tells: when it trained again and from which
        checkpoint. LAST_STEP: the failed attempt's last step seen (its beats)."""
        self.started_at = summary.get("start")
        self.training_again_at = summary.get("first_step_at")
        failed = _time(self.failed_at)
        started, again = _time(self.started_at), _time(self.training_again_at)
        if failed is not None and started is not None:
            self.restart_s = round(started - failed, 3)
        if failed is not None and again is not None:
            self.down_s = round(again - failed, 3)
        if started is not None and again is not None:
            self.resume_s = round(again - started, 3)
        heard = _time(self.last_heard_at)
        if heard is not None and again is not None:
            self.silent_s = round(again - heard, 3)
        found = RESUMED.search(log_text)
        if found:
            self.load_s = float(found["load_s"])
            step = int(found["step"])
            self.resumed_from = {"checkpoint": found["checkpoint"],
                                 "epoch": int(found["epoch"]), "step": step}
            if last_step is not None:
                self.steps_lost = max(0, last_step - step)

    def line(self) -> str:
        """The recovery in one line (train's output, `runs show`)."""
        where = f"{self.spare} took its place" if self.spare else "on fewer nodes"
        told = [f"recovery {self.attempt}: {self.node} {self.why} at {self.failed_at}; "
                f"{where}, as {self.run_id} on {', '.join(self.nodes)}"]
        if self.down_s is not None:
            told.append(f"training again {self.down_s:.1f} s later" + (
                f", {self.silent_s:.1f} s after its last heartbeat"
                if self.silent_s is not None else "") + " (torchrun restarted "
                        f"after {self.restart_s:.1f} s, first step {self.resume_s:.1f} s "
                        "after that" + (f", checkpoint loaded in {self.load_s:.2f} s"
                                        if self.load_s is not None else "") + ")")
        if self.resumed_from:
            told.append(f"resumed from {self.resumed_from['checkpoint']} (epoch "
                        f"{self.resumed_from['epoch']}, step {self.resumed_from['step']}"
                        + (f", {self.steps_lost} step(s) done again"
                           if self.steps_lost is not None else "") + ")")
        return "; ".join(told)


def _time(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def exhausted(run_id: str, failures: Sequence[Failure], most: int) -> LaunchError:
    """The error of a run whose every recovery was used up, naming each failure."""
    return LaunchError(
        f"run {run_id} failed: its node failed {len(failures)} time(s) and --max-recoveries "
        f"{most} allowed {most} recover{'y' if most == 1 else 'ies'}: "
        + "; ".join(f"{f.run_id}: {f.node} {f.why} at {f.at}" for f in failures)
        + ". The nodes lost are cordoned; each attempt's logs are in its own record")


# -- a detached run: the nodes start the next attempt (node/recover.py) --------------------

def launch_template(command: NodeCommand) -> str:
    """COMMAND's launch line with what changes from one attempt and node to the next left
    as placeholders (protocol.TEMPLATE), which a node fills in for its part."""
    t = TEMPLATE
    # The placeholders stand where numbers go: the line is text, the node writes numbers.
    return replace(command, run_id=t["run"], node_rank=t["rank"], nnodes=t["nnodes"],  # type: ignore[arg-type]
                   master_addr=t["master"], node=t["node"], nodes=(t["nodes"],),
                   addresses=(t["addresses"],), run_state=t["state"], home=t["home"],
                   torchrun=t["torchrun"], python=t["python"],
                   env={**command.env, RECOVERY_ENV: t["attempt"]}).shell()


@dataclass(frozen=True)
class SpareFacts:
    """What a spare's part of an attempt needs of it (its preflight found them)."""
    address: str
    python: str
    torchrun: str
    home: str


def detached_plan(commands: Sequence[NodeCommand], spares: Mapping[str, SpareFacts],
                  most: int, min_nodes: int | None, share: str, drain: bool,
                  synced: bool, admin_group: str) -> dict[str, Any]:
    """The plan the nodes of a detached run recover by, left on the share at launch."""
    first = commands[0]
    return {"run_id": first.run_id, "state": first.run_state,
            "template": launch_template(first), "max_recoveries": most,
            "min_nodes": min_nodes, "nodes": list(first.nodes), "spares": list(spares),
            "addresses": {**dict(zip(first.nodes, first.addresses, strict=True)),
                          **{n: f.address for n, f in spares.items()}},
            "spare_facts": {n: asdict(f) for n, f in spares.items()},
            "share": share, "drain": drain, "synced": synced, "admin_group": admin_group}


def recovery_of(decision: Mapping[str, Any]) -> Recovery:
    """The recovery a detached run's nodes decided (node/recover.py's next.json)."""
    heard = decision.get("last_heard_at")
    return Recovery(int(decision["attempt"]), decision["failed_run"], decision["node"],
                    decision["why"], iso(float(decision["failed_at"])), decision["run_id"],
                    list(decision["nodes"]), decision.get("spare"),
                    bool(decision.get("cordoned")), iso(float(heard)) if heard else None)


def attempt_info(info: Mapping[str, Any], decision: Mapping[str, Any]) -> dict[str, Any]:
    """run.json of the attempt a detached run's nodes started (DECISION), from the failed
    attempt's (INFO): each node's command as the node filled in the plan's template."""
    plan, records = info["recovery_plan"], info["node_commands"]
    nodes, run_id = list(decision["nodes"]), str(decision["run_id"])
    base = records[info["nodes"][0]]
    commands = {}
    for rank, name in enumerate(nodes):
        own = records.get(name) or {**base, **{k: v for k, v in plan["spare_facts"][name]
                                               .items() if k != "address"}}
        commands[name] = {**own, "run_id": run_id, "node_rank": rank, "nnodes": len(nodes),
                          "master_addr": decision["addresses"][0], "node": name,
                          "nodes": nodes, "addresses": list(decision["addresses"]),
                          "run_state": attempt_dir(plan["state"], run_id),
                          "env": {**own["env"], RECOVERY_ENV: str(decision["attempt"])}}
    first = commands[nodes[0]]
    user = info["users"][info["nodes"][0]]   # the spares' user: the inventory's, as the run's
    return {**info, "run_id": run_id, "nodes": nodes, "node_commands": commands,
            "users": {n: info["users"].get(n, user) for n in nodes},
            "master": {"addr": first["master_addr"], "port": first["master_port"]},
            "commands": {n: NodeCommand.from_record(c).torchrun_argv()
                         for n, c in commands.items()},
            "recovery": recovery_of(decision).to_json()}
