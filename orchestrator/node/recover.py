"""A detached run recovers on its nodes (`train --detach --max-recoveries N`): nobody is
attached to start the next attempt, so the nodes do, as the controller would have.

- At launch the controller leaves the plan on the share (the first attempt's
  STATE/recovery/plan.json): a node's launch line with placeholders (protocol.TEMPLATE),
  the spares and what each needs, how many recoveries, --min-nodes, the share, whether
  the cluster drains in Slurm. Each spare waits in a standby process (`node.py standby`).
- A supervisor whose part ended because of a peer's fault (the peer lost, its supervisor
  failed, its torchrun killed by a signal) decides the next attempt: the healthy nodes in
  their order, then the first spare not in use nor cordoned in the failed node's place
  (or the healthy ones alone, --min-nodes). A spare counts only while its standby says,
  every STANDBY_LOOK seconds on the share, that nobody else uses its node (another user's
  run or notebook, a GPU process): the node that decides cannot see another user's
  processes on the spare, and a spare whose standby is gone (its node down) would not
  start its part. The first to take the failed attempt's lock
  cordons the node (and drains it) and writes the decision (STATE/recovery/next.json);
  the others read it. Every node the decision names, the spare's standby included,
  starts its part of the next attempt: the launch line filled in, run by its own shell,
  in the first attempt's code snapshot, with CLUSTERTRAIN_RECOVERY=<n>.
- `attach` and `runs` read the decision (states.py) and record the attempt (`RUN.rN`)
  as an attached run's recovery is recorded.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys
import time
from typing import Any

from . import busy, cordon
from .fault import node_fault
from .protocol import (
    CODE_SUBDIR,
    DRAIN,
    NEXT_FILE,
    NODE_STATE_DIR,
    PEER_START,
    PEER_TIMEOUT,
    PLAN_FILE,
    RECOVERY_SUBDIR,
    STANDBY_IDLE,
    STARTED,
    TEMPLATE,
    End,
    GoWord,
)
from .requests import Standby
from .util import detach, read_json, write_json

SAFE = re.compile(r"[\w@%+=:,./-]+")   # a value that needs no quoting in the shell line
LOCK = "next.lock"
DECISION_WAIT = 20.0   # a node that lost the lock waits this long for the decision
STANDBY_LOOK = 5.0     # seconds between a standby's looks at who else uses its node
STANDBY_STALE = 60.0   # a standby's word older than this: the spare is not standing by


def plan_path(state_dir: str) -> str:
    return os.path.join(state_dir, RECOVERY_SUBDIR, PLAN_FILE)


def next_path(state_dir: str) -> str:
    return os.path.join(state_dir, RECOVERY_SUBDIR, NEXT_FILE)


def standby_path(root_state: str, node: str) -> str:
    """Where NODE's standby says whether its node is free (the first attempt's state)."""
    return os.path.join(root_state, RECOVERY_SUBDIR, f"standby-{node}.json")


def others_on(found: busy.Busy, me: str) -> list[str]:
    """Who else uses a node, in words: other users' runs (notebooks too) and GPU processes.
    The run's own user's other work there is his to share (as --share-gpus is)."""
    return ([f"{r.user}'s {r.kind} {r.run}" for r in found.runs if r.user != me] +
            [f"{g.user or 'another user'}'s GPU process {g.pid}"
             for g in found.gpu_processes if g.user != me])


def unfit(plan: dict[str, Any], spare: str, now: float) -> str | None:
    """Why SPARE cannot take a failed node's place now (None: it can), from what its
    standby last said on the share."""
    said = read_json(standby_path(plan["state"], spare))
    at = said.get("at") if isinstance(said, dict) else None
    if not isinstance(at, (int, float)):
        return "its standby never said it was ready"
    if now - at > STANDBY_STALE:
        return f"no word from its standby for {now - at:.0f} s"
    others = said.get("others") if isinstance(said, dict) else None
    if others:
        return "in use by " + "; ".join(str(o)[:120] for o in list(others)[:3])
    return None


def attempt_of(run_id: str) -> int:
    """0 for the first attempt RUN, N for RUN.rN."""
    found = re.search(r"\.r(\d+)$", run_id)
    return int(found.group(1)) if found else 0


def attempt_dir(root_state: str, run_id: str) -> str:
    """An attempt's state directory, beside the first attempt's."""
    return os.path.join(os.path.dirname(root_state.rstrip("/")), run_id)


def fault(reason: End, peer: str, peer_state: dict[str, Any]) -> str | None:
    """Why the run ended by PEER's fault (fault.py: the rule the controller uses too), or
    None when it was not a node's fault (the script's failure, a stop, a hang)."""
    if reason == End.PEER_LOST:
        return node_fault(End.LOST, f"no word from it for {PEER_TIMEOUT:g} s", None)
    if reason != End.PEER_FAILED:
        return None
    return node_fault(peer_state.get("reason"), peer_state.get("why") or "",
                      peer_state.get("code"))


def next_nodes(plan: dict[str, Any], nodes: list[str], failed: str
               ) -> tuple[list[str], str | None] | None:
    """The next attempt's nodes and the spare among them; None when no spare is left and
    the healthy nodes are fewer than --min-nodes."""
    healthy = [n for n in nodes if n != failed]
    kept_out = set(cordon.cordoned(plan["share"], plan.get("admin_group")
                                   or cordon.DEFAULT_ADMIN_GROUP)) if plan.get("share") else set()
    spare = None
    for candidate in plan.get("spares") or []:
        if candidate in nodes or candidate in kept_out:
            continue
        why = unfit(plan, candidate, time.time())
        if why is None:
            spare = candidate
            break
        _say(f"spare {candidate} passed over: {why}")
    if spare is not None:
        return [*healthy, spare], spare
    least = plan.get("min_nodes")
    if least is not None and len(healthy) >= least:
        return healthy, None
    return None


def decide(plan: dict[str, Any], state_dir: str, run_id: str, me: str, nodes: list[str],
           failed: str, why: str, heard: float | None) -> dict[str, Any] | None:
    """The decision of the attempt RUN_ID that failed by FAILED: this node's own (it took
    the lock first: the failed node is cordoned and drained first), or the one another
    node wrote. None when there is no next attempt (recoveries used up, no spare)."""
    attempt = attempt_of(run_id) + 1
    where = os.path.join(state_dir, RECOVERY_SUBDIR)
    os.makedirs(where, exist_ok=True)
    try:
        os.close(os.open(os.path.join(where, LOCK), os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                         0o600))
    except FileExistsError:
        return _await_decision(next_path(state_dir))
    # The failed node is kept out whether or not the run goes on: the next run to be
    # placed on it, anybody's, would fail too.
    reason = f"{failed} lost mid-run {run_id} ({why})" if why.startswith("lost") else \
        f"{failed} failed mid-run {run_id} ({why})"
    failed_at = time.time()
    cordoned, drained = _keep_out(plan, failed, reason, run_id)
    chosen = None if attempt > int(plan.get("max_recoveries") or 0) else \
        next_nodes(plan, nodes, failed)
    if chosen is None:
        _say(f"{failed} {why}; " + (
            f"--max-recoveries {plan.get('max_recoveries')} used up"
            if attempt > int(plan.get("max_recoveries") or 0) else
            "no spare is left and the healthy nodes are fewer than --min-nodes")
            + ": the run ends here")
        write_json(next_path(state_dir), {"attempt": None, "failed_run": run_id,
                                          "node": failed, "why": why, "cordoned": cordoned,
                                          "drained": drained})
        return None
    names, spare = chosen
    run = f"{plan['run_id']}.r{attempt}"
    decision = {"attempt": attempt, "run_id": run, "failed_run": run_id, "node": failed,
                "why": why, "failed_at": failed_at, "last_heard_at": heard,
                "nodes": names, "addresses": [plan["addresses"][n] for n in names],
                "spare": spare, "cordoned": cordoned, "drained": drained, "decided_by": me}
    write_json(next_path(state_dir), decision)
    _say(f"{failed} {why}: recovery {attempt} of {plan['max_recoveries']} as {run} on "
         f"{', '.join(names)}" + (f" ({spare}, a spare, in {failed}'s place)" if spare else ""))
    return decision


def _await_decision(path: str) -> dict[str, Any] | None:
    deadline = time.monotonic() + DECISION_WAIT
    while time.monotonic() < deadline:
        decision = read_json(path)
        if isinstance(decision, dict):
            return decision if decision.get("attempt") else None
        time.sleep(0.2)
    _say(f"no decision in {path} after {DECISION_WAIT:g} s: the node that took the lock "
         "failed; the run ends here")
    return None


def _keep_out(plan: dict[str, Any], node: str, why: str, run_id: str) -> tuple[bool, bool]:
    """Cordon NODE in the share's record and, on a Slurm cluster, drain it."""
    cordoned = drained = False
    try:
        cordon.record(plan["share"], node, cordon.CORDON, why, run_id)
        cordoned = True
    except (cordon.NoRecord, OSError) as exc:
        _say(f"could not cordon {node}: {exc}")
    if plan.get("drain"):
        done = subprocess.run(["sudo", "-n", DRAIN, node, why], capture_output=True,
                              text=True, timeout=30, check=False)
        drained = done.returncode == 0
        if not drained:
            _say(f"could not drain {node} in Slurm: {done.stderr.strip()[-200:]}")
    return cordoned, drained


def fill(plan: dict[str, Any], decision: dict[str, Any], me: str, python: str,
         torchrun: str, home: str) -> str:
    """This node's launch line for the attempt DECISION names: the plan's template filled
    in. ValueError for a value that would need quoting in it."""
    nodes = decision["nodes"]
    run = decision["run_id"]
    values = {"run": run, "rank": str(nodes.index(me)), "nnodes": str(len(nodes)),
              "master": decision["addresses"][0], "node": me, "nodes": ",".join(nodes),
              "addresses": ",".join(decision["addresses"]),
              "state": attempt_dir(plan["state"], run), "home": home,
              "torchrun": torchrun, "python": python, "attempt": str(decision["attempt"])}
    unsafe = {k: v for k, v in values.items() if not SAFE.fullmatch(v)}
    if unsafe:
        raise ValueError(f"{unsafe} would need quoting in a launch line")
    line = plan["template"]
    for name, value in values.items():
        line = line.replace(TEMPLATE[name], value)
    return line


def launch(plan: dict[str, Any], decision: dict[str, Any], me: str, python: str,
           torchrun: str) -> bool:
    """Start this node's part of the attempt DECISION names: its launch line (fill), run
    by the shell as SSH would have run it, given GO at once (the peers' ring ports are
    read from the share), in the first attempt's code snapshot. True when its supervisor
    started."""
    run, home = decision["run_id"], os.path.expanduser("~")
    try:
        line = fill(plan, decision, me, python, torchrun, home)
    except ValueError as exc:
        _say(f"cannot start {run} here: {exc}")
        return False
    if plan.get("synced"):   # the first attempt's code snapshot, under this attempt's name
        code = os.path.join(home, NODE_STATE_DIR, CODE_SUBDIR)
        try:
            os.symlink(plan["run_id"], os.path.join(code, run))
        except FileExistsError:
            pass
    # GO brings the run's key and secret variables (from the plan, which only this user
    # reads); the peers' ring ports are read from the share.
    go = GoWord(bytes.fromhex(plan["key"]), {}, dict(plan.get("secret_env") or {}))
    done = subprocess.run(["sh", "-c", line], input=go.line(), capture_output=True,
                          text=True, timeout=120, check=False)
    if STARTED not in done.stdout:
        _say(f"{run} did not start here (exit {done.returncode}): "
             f"{(done.stderr or done.stdout).strip()[-500:]}")
        return False
    _say(f"{run}: started here as node rank {decision['nodes'].index(me)} of "
         f"{len(decision['nodes'])}")
    return True


def after_end(state_dir: str, run_id: str, me: str, nodes: list[str], reason: End,
              peer: str, peer_state: dict[str, Any], heard: float | None,
              torchrun: str) -> None:
    """A supervisor's part ended: when by PEER's fault and the run may recover, decide the
    next attempt and start this node's part of it."""
    why = fault(reason, peer, peer_state)
    if why is None:
        return
    root = attempt_dir(state_dir, re.sub(r"\.r\d+$", "", run_id))
    plan = read_json(plan_path(root))
    if not isinstance(plan, dict):
        return   # the run does not recover (no plan), or the share lost it
    decision = decide(plan, state_dir, run_id, me, nodes, peer, why, heard)
    if decision is not None and me in decision["nodes"]:
        launch(plan, decision, me, sys.executable, torchrun)


def standby(args: Standby) -> int:
    """A spare's standby (`node.py standby`): follow the run's attempts on the share; start
    this node's part when a decision names it; leave STANDBY_IDLE after the latest
    attempt's last end with no decision (the run is over), or once the plan is gone."""
    plan = read_json(args.plan)
    if not isinstance(plan, dict):
        _say(f"no recovery plan at {args.plan}")
        return 1
    if args.detach:
        os.makedirs(os.path.dirname(args.log), exist_ok=True)
        pid = detach(args.log, append=True)
        if pid:
            print(f"{STARTED} {pid}", flush=True)
            return 0
    state, run = plan["state"], plan["run_id"]
    nodes = list(plan["nodes"])
    since = time.time()
    look = 0.0
    while os.path.exists(args.plan):
        if time.monotonic() >= look:
            look = time.monotonic() + STANDBY_LOOK
            say_ready(plan, args.node)
        decision = read_json(next_path(state))
        if isinstance(decision, dict):
            if not decision.get("attempt"):
                return 0
            if args.node in decision["nodes"]:
                return 0 if launch(plan, decision, args.node, sys.executable,
                                   args.torchrun) else 1
            run, nodes = decision["run_id"], decision["nodes"]
            state = attempt_dir(plan["state"], run)
            continue
        states = [s for s in (read_json(os.path.join(state, f"{n}.json")) for n in nodes)
                  if isinstance(s, dict)]
        ended = [float(s["ended"]) for s in states if isinstance(s.get("ended"), (int, float))]
        if ended and time.time() - max(ended) > STANDBY_IDLE:
            _say(f"{run} ended without a decision that names {args.node}: leaving")
            return 0
        if not states and time.time() - since > PEER_START:
            _say(f"{run} never started on its nodes: leaving")
            return 0
        time.sleep(1.0)
    return 0


def say_ready(plan: dict[str, Any], node: str) -> None:
    """Tell the run's nodes, on the share, whether anybody else uses this spare now."""
    try:
        write_json(standby_path(plan["state"], node),
                   {"at": time.time(),
                    "others": others_on(busy.scan(exclude=plan["run_id"]),
                                        pwd.getpwuid(os.getuid()).pw_name)},
                   sync=False)
    except OSError as exc:   # a stalled or full share: the word goes stale, the spare unused
        _say(f"could not say that {node} stands by: {exc}")


def _say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} recovery: {text}", flush=True)
