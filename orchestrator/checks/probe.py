"""What preflight asks each node, and what it learns: the node side is
orchestrator/node/preflight.py (`node.py probe|reach|unlisten|release`, run by the node's
system python from the node package, which the first call copies to a node that lacks
this version); it answers in JSON.

Round 1, every node at once (`probe`): who the job runs as, the environment as it is now
(a live fingerprint read from the environment's metadata, roles/python_env/files/
fingerprint.py, the same code the python_env role uses), the fingerprint written at
provisioning, torch (imported only when the environment changed since the last time it
was checked on that node), GPUs (without torch), the shared path (a mount of the right
kind, writable by the job's user), who else uses the node (live runs of any user, found
by their supervisors' processes; processes on its GPUs), names, and on node 0 the master
port: a free one is claimed, and a short-lived listener is started on it.

Round 2, every other node (`reach`): the shared path shows the token node 0 wrote there
(the same filesystem), and node 0's master port answers from here (no firewall between).
The listener counts a node only when it proves the run's key (Rendezvous), so no other
user who connects to it can stop it or take a node's place; it names those who tried.
The listener ends as soon as every node has connected: torchrun then binds the port.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field, fields
from typing import Any

from .. import defaults
from ..cluster import nodelib, ssh
from ..cluster.inventory import NodeSpec
from ..node import requests as rq
from ..node.answers import ProbeAnswer, ReachAnswer
from ..node.protocol import BOUND_WAIT

CONNECT_TIMEOUT = 3.0    # seconds for a node to open a TCP connection to node 0's port
# Seconds a node waits, at the end of its probe, for node 0 to listen (round 2 ahead): node 0
# probes at the same time, and its listener comes last. Past it, round 2 asks again.
REACH_AHEAD_WAIT = 3.0
# The listener on node 0 gives up after LISTEN_SECONDS + LISTEN_PER_NODE x the nodes: it
# starts in round 1, and the others connect in round 2, after every node's round 1, which
# on a slow controller (or a sandbox of 32 nodes on two cores) grows with their number.
# Once every node connected it ends at once; a node that cannot connect is reported from
# its own side (CONNECT_TIMEOUT), so a longer window costs nothing.
LISTEN_SECONDS = 30.0
LISTEN_PER_NODE = 2.0


@dataclass
class NodeFacts(ProbeAnswer):
    """What preflight learned about one node: its probe's answer (node/answers.py
    ProbeAnswer: the facts are declared there, once), the node it came from, and ERROR
    when SSH or the probe itself failed (then no fact is known)."""

    node: NodeSpec
    error: str | None = None
    clock_offset: float | None = None  # node clock minus controller clock, seconds

    @classmethod
    def of(cls, node: NodeSpec, answer: ProbeAnswer, received: float) -> NodeFacts:
        """NODE's facts from its probe's ANSWER, RECEIVED at that time on this machine."""
        facts = cls(node, **{f.name: getattr(answer, f.name) for f in fields(answer)})
        if answer.time is not None:
            facts.clock_offset = answer.time - received
        return facts

    @property
    def gpus(self) -> int:
        if self.gpu_count is not None:
            return int(self.gpu_count)
        return int(self.torch.get("gpus") or 0)


@dataclass(frozen=True)
class Rendezvous:
    """What node 0's listener expects: a nonce it greets with (public), how many
    connections, the token file it wrote on the share (read by the others, and by anyone
    who reads the share), and the run's key, which every node proves it holds to be counted
    or to stop the listener (node/preflight.py serve): it travels only in the requests' standard
    input, never on a command line or the share, so no other user's process can."""

    nonce: str
    token_name: str
    token_value: str
    expect: int
    key: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)

    @classmethod
    def new(cls, nodes: int) -> Rendezvous:
        nonce = secrets.token_hex(8)
        return cls(nonce, f".clustertrain-token-{nonce}", secrets.token_hex(16), nodes)

    def token(self, shared_path: str) -> dict[str, str]:
        """Where the other nodes find node 0's token on the share, and what it holds."""
        return {"path": f"{shared_path.rstrip('/')}/checkpoints/{self.token_name}",
                "value": self.token_value}


@dataclass(frozen=True)
class Ahead:
    """What a node but node 0 needs to do round 2's check at the end of round 1: node 0's
    rendezvous and the master port asked for (node 0 listens there when it is free)."""

    rendezvous: Rendezvous
    port: int


def release_port(node: NodeSpec, conn: ssh.Connection, run_id: str,
                 once_bound: int | None = None) -> None:
    """Drop the master-port claim a launch made on node 0 (it would lapse by itself); with
    ONCE_BOUND, once that port is bound (torchrun's store listens) or BOUND_WAIT passed."""
    nodelib.call(conn, node.python, rq.Release(run_id, once_bound or None),
                 timeout=30 + BOUND_WAIT)


def probe(node: NodeSpec, conn: ssh.Connection, *, shared: dict[str, Any],
          addresses: list[str], port: int | None, run_id: str | None = None,
          strict_port: bool = False, rendezvous: Rendezvous | None = None,
          master_address: str | None = None, span: int = defaults.RENDEZVOUS_SPAN,
          admin_group: str = defaults.ADMIN_GROUP, ahead: Ahead | None = None) -> NodeFacts:
    """What NODE is like now (round 1). SHARED: {"path", "fstypes"} (fstypes None: any
    mount). With PORT (node 0), whether that master port is free, else the next free one;
    with RUN_ID too, the port found is claimed for that run (of SPAN ports from PORT up);
    with RENDEZVOUS, node 0
    writes its token on the share and listens on that port until all nodes connected. With
    AHEAD (every other node), the node then connects to node 0's port and reads its token:
    round 2's check, done ahead (NodeFacts.reach; None where it could not be)."""
    spec = dict(shared)
    request: dict[str, Any] = {"shared": spec, "addresses": addresses, "port": port,
                               "span": span, "run": run_id, "admin_group": admin_group,
                               "strict": strict_port,
                               "state_dir": node.env_state_dir,
                               "user_env": node.python_env, "node": node.name}
    if ahead is not None:   # round 2's check, at the end of round 1 (node/preflight.py reach_ahead)
        request["reach"] = {"address": master_address, "port": ahead.port,
                            "nonce": ahead.rendezvous.nonce, "key": ahead.rendezvous.key,
                            "timeout": CONNECT_TIMEOUT,
                            "wait": REACH_AHEAD_WAIT,
                            "token": ahead.rendezvous.token(shared["path"])}
    if rendezvous is not None:
        spec["token"] = {"name": rendezvous.token_name, "value": rendezvous.token_value}
        request["listen"] = {"nonce": rendezvous.nonce, "key": rendezvous.key,
                             "expect": rendezvous.expect,
                             "address": master_address, "timeout": CONNECT_TIMEOUT,
                             "seconds": LISTEN_SECONDS + LISTEN_PER_NODE * rendezvous.expect}
    result = nodelib.call(conn, node.python, rq.Probe(), timeout=150,
                          stdin=json.dumps(request))
    received = time.time()
    try:
        answer = nodelib.answer_to(result, node.name, rq.Probe())
    except nodelib.NodeAnswerError as exc:
        return NodeFacts(node, error=f"probe failed with {node.python}: {exc.said}")
    return NodeFacts.of(node, answer, received)


def reach(node: NodeSpec, conn: ssh.Connection, *, addr: str, port: int,
          rendezvous: Rendezvous, shared_path: str) -> ReachAnswer:
    """Round 2 on a node other than node 0: does it see node 0's token on the shared path,
    and does node 0's listener on the master port answer it? (ERROR: the node could not
    say.)"""
    request = {"addr": addr, "port": port, "nonce": rendezvous.nonce, "key": rendezvous.key,
               "timeout": CONNECT_TIMEOUT,
               "token": rendezvous.token(shared_path)}
    try:
        return nodelib.ask(conn, node.python, rq.Reach(), node=node.name,
                           timeout=CONNECT_TIMEOUT * 3 + 30, stdin=json.dumps(request))
    except nodelib.NodeAnswerError as exc:
        return ReachAnswer(error=exc.said)


def stop_listener(node: NodeSpec, conn: ssh.Connection, port: int,
                  rendezvous: Rendezvous) -> list[dict[str, str]]:
    """End node 0's listener now (when not every node connected to it), proving the run's
    key (`reach` with "stop"); who connected to it without the key (node/preflight.py serve)."""
    request = {"stop": True, "port": port, "nonce": rendezvous.nonce, "key": rendezvous.key}
    try:
        said = nodelib.ask(conn, node.python, rq.Reach(), node=node.name, timeout=30,
                           stdin=json.dumps(request))
    except nodelib.NodeAnswerError:
        return []   # an older listener's, or none: it ends by itself
    return said.strangers
