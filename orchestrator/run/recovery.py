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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..cluster import ssh
from ..cluster.drain import KeptOut, keep_out
from ..cluster.inventory import Cluster
from ..errors import InputError, LaunchError
from ..node.fault import node_fault, ranks_killed
from ..node.protocol import TEMPLATE, End
from ..node.recover import attempt_dir
from ..record.rundir import iso
from ..record.summary import Recovery, RunStatus, Summary
from .command import NodeCommand

RECOVERY_ENV = "CLUSTERTRAIN_RECOVERY"   # each attempt's number: 0, then 1, 2, ...


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


def node_failure(summary: Summary) -> Failure | None:
    """The node fault that ended this attempt (node/fault.py), or None when it was not
    one (it succeeded, the script failed by itself, it was stopped, interrupted or hung)."""
    if summary.status != RunStatus.FAILED or not summary.first_failed:
        return None
    name = summary.first_failed
    node = summary.node(name)
    reason = node.end_reason if node else None
    why = node_fault(reason, node.why if node else "", node.exit_code if node else None) \
        or ranks_killed(summary.rank_exit_codes.get(name) or {})
    if why is None:
        return None
    return Failure(summary.run_id, name, why, reason == End.LOST, str(summary.end))


def lost_nodes(summary: Summary) -> dict[str, str]:
    """The nodes the run lost (no word from them: down, cut off), each with why."""
    return {n.name: n.why or "no word from it" for n in summary.nodes if n.end_reason == "lost"}


def keep_out_lost(summary: Summary, cluster: Cluster,
                  clients: Mapping[str, ssh.Connection],
                  say: Callable[[str], None] = print) -> KeptOut:
    """Keep out each node the run lost, asked from a node it did not lose."""
    lost = lost_nodes(summary)
    asker = next(((n, c) for n, c in clients.items() if n not in lost and c.alive()), None)
    return keep_out(cluster, {node: f"{node} lost mid-run {summary.run_id} ({why})"
                              for node, why in lost.items()}, summary.run_id,
                    asker, say)


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
