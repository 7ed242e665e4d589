"""How a run's supervisors know that the others are alive: a ring of UDP beats over the
cluster's network, not files on the share (a share that stalls must not look like dead
nodes, and N nodes reading N files a second is a load that grows with N squared).

- Node i sends one small datagram a second to the next live node of the ring (i+1, or
  past it the ones known to have ended) and hears one from the previous one: every node
  sends and receives one beat a second, whatever the size of the cluster.
- Each beat carries the news: the nodes whose part has ended (how and why), the nodes
  found hung and dumped, the nodes found lost and by whom. News a node did not know is
  passed on at once (but a node that finished well, or stopped for another's cause: on
  the next beat), so it goes round
  the ring in milliseconds, not a beat a hop; it also rides on every later beat, so a
  lost datagram costs one beat.
- A node's predecessor that stays silent for PEER_TIMEOUT is looked up once on the share:
  ended there (its last word was lost), it ended; otherwise it is lost, and the news goes
  round. A supervisor that was itself held up (stopped, starved, its clock jumped) gives
  its predecessor a fresh PEER_TIMEOUT first: its own stall is not the network's word.
- Each beat also carries how long ago the freshest progress the sender knows of was made
  (its own, or what its predecessor told it), so every node knows how long the whole
  run has been quiet (hang detection) without reading anyone's file.
- Only the run's own supervisors are heard. The run id, the node names, their addresses
  and the ring's ports are no secret (`ps`, /proc/net/udp), so a beat proves itself: it
  carries an HMAC-SHA256 of its content under the run's key (32 random bytes the launch
  brings each supervisor on its standard input, never on a command line or in an
  environment), and a sequence number that only grows. A datagram whose MAC is not the
  run's, that comes from another address than the node it names, or whose number this
  node has already seen from that node (a replay) is counted, logged with its source, and
  never acted on.

Standard library only: it runs on the nodes (the node package).
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .protocol import BEAT, PEER_START, PEER_TIMEOUT, RING_KEY_BYTES
from .util import read_json

MAX_DATAGRAM = 65507
FINAL_REPEATS = 3        # a node's last word is sent this many times, REPEAT_GAP apart
REPEAT_GAP = 0.02        # seconds: `train` returns once the supervisors, which send them, exit
MAC_BYTES = 32           # HMAC-SHA256, in front of every beat's content
SAID_REJECTIONS = 5      # rejected datagrams logged one by one; past that, one line a...
REJECTION_EVERY = 60.0   # ...minute with the count


@dataclass
class Counters:
    """What one node's supervision cost: share operations and datagrams."""
    share_reads: int = 0
    share_writes: int = 0
    sent: int = 0
    received: int = 0
    rejected: int = 0    # datagrams not the run's (MAC, sender's address, replay)
    started: float = field(default_factory=time.monotonic)

    def to_json(self) -> dict:
        seconds = max(time.monotonic() - self.started, 1e-9)
        return {"seconds": round(seconds, 1), "share_reads": self.share_reads,
                "share_writes": self.share_writes, "sent": self.sent,
                "received": self.received, "rejected": self.rejected}


def seal(key: bytes, content: bytes) -> bytes:
    """A datagram: CONTENT behind its HMAC-SHA256 under KEY."""
    return _mac(key, content) + content


def unseal(key: bytes, data: bytes) -> bytes | None:
    """DATA's content if its MAC is KEY's, else None."""
    mac, content = data[:MAC_BYTES], data[MAC_BYTES:]
    if len(mac) < MAC_BYTES or not _same(mac, _mac(key, content)):
        return None
    return content


def _mac(key: bytes, content: bytes) -> bytes:
    # hmac (and OpenSSL behind it) is imported at the first beat, after torchrun has
    # started: a supervisor's start before READY is part of every launch (bench/README.md).
    import hmac  # noqa: PLC0415
    return hmac.digest(key, content, "sha256")


def _same(a: bytes, b: bytes) -> bool:
    import hmac  # noqa: PLC0415 - see _mac
    return hmac.compare_digest(a, b)


class Ring:
    """This node's place in the ring of run RUN. NAMES and ADDRESSES are every node of the
    run in rank order; LOOKUP(name) reads that node's state on the share (its ring port,
    or its end), and may block while the share stalls: only the caller of `look()` waits
    for it, never the beats. KEY: the run's ring key (see the module's doc)."""

    def __init__(self, run: str, me: str, names: list[str], addresses: list[str],
                 lookup: Callable[[str], dict | None], counters: Counters, key: bytes,
                 sock: socket.socket | None = None, ports: dict[str, int] | None = None
                 ) -> None:
        if len(key) < RING_KEY_BYTES:
            raise ValueError(f"a ring key has {RING_KEY_BYTES} bytes or more, not {len(key)}")
        self.run, self.me, self.names, self.key = run, me, list(names), key
        self.addresses = dict(zip(names, addresses, strict=True))
        self.lookup, self.counters = lookup, counters
        self.sock = sock or ring_socket(addresses)
        self.family = self.sock.family
        self.port: int = self.sock.getsockname()[1]
        # Every node's ring port, as the launch's GO brought them; a node missing here
        # (a supervisor started without the launch) is looked up in its state file.
        self.ports = dict(ports or {})
        self.targets: dict[str, tuple] = {}     # node: its socket address (ring port known)
        self.senders: dict[str, tuple] = {}     # node: the address its beats came from
        self.next_read = 0.0    # a predecessor not heard yet: its file, every few seconds
        self.started_ok: set[str] = set()   # ... and found running there
        self.lock = threading.Lock()
        # The news: each node's own word of itself (a version each), and who found whom lost.
        self.status: dict[str, dict] = {}
        self.lost: dict[str, dict] = {}
        self.heard: dict[str, tuple[float, float]] = {}   # node: (monotonic, wall) last heard
        self.seq = 0                           # this node's beats, numbered
        self.last_seq: dict[str, int] = {}     # node: the highest number heard from it
        self.ips: dict[str, set[str]] = {}     # node: the addresses its beats may come from
        self.rejections = Rejections()
        self.progress_at: float | None = None   # monotonic: the freshest progress known
        self.watching: tuple[str, float] | None = None    # (predecessor, watched since)
        self.started = time.monotonic()
        self.closed = threading.Event()
        # close() wakes the beats' thread at once (a wait up to BEAT otherwise delays every
        # supervisor's end, and so every run's).
        self.wake, self.waker = socket.socketpair()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.repeats: threading.Thread | None = None   # the last word's (last_word)

    # -- what the supervisor tells the ring ---------------------------------------------
    def start(self) -> None:
        if len(self.names) > 1:
            self.thread.start()

    def say(self, **word: object) -> None:
        """This node's own state changed (ended, hung and dumped, dump cleared): tell the
        ring now."""
        with self.lock:
            old = self.status.get(self.me, {})
            self.status[self.me] = {**word, "v": int(old.get("v", 0)) + 1}
        self._send()

    def progress(self, quiet: float) -> None:
        """This node's ranks last made progress QUIET seconds ago."""
        at = time.monotonic() - quiet
        with self.lock:
            self.progress_at = max(self.progress_at or at, at)

    def last_word(self, **word: object) -> None:
        """This node's part ended: say so at once to the next node and to the one before
        (which then sends past this node at once), and again a few times, REPEAT_GAP apart,
        on a thread of its own (datagrams can be lost): the caller records the end
        meanwhile, not a fifth of a second later. `close()` waits for the repeats."""
        self.say(**word)
        self._send(back=True)
        self.repeats = threading.Thread(target=self._repeat_last_word, daemon=True)
        self.repeats.start()

    def _repeat_last_word(self) -> None:
        for _ in range(FINAL_REPEATS - 1):
            time.sleep(REPEAT_GAP)
            self._send()
            self._send(back=True)

    def close(self) -> None:
        """Stop, once the last word's repeats are sent."""
        if self.repeats is not None:
            self.repeats.join(timeout=FINAL_REPEATS * REPEAT_GAP + BEAT)
        self.closed.set()
        try:
            self.waker.send(b"!")
        except OSError:
            pass   # closed already
        if self.thread.is_alive():
            self.thread.join(timeout=2 * BEAT)
        for sock in (self.sock, self.wake, self.waker):
            sock.close()

    def forgive(self) -> None:
        """This node was held up (see the module's doc): the predecessor it watches gets a
        fresh PEER_TIMEOUT from now."""
        with self.lock:
            if self.watching:
                self.watching = (self.watching[0], time.monotonic())

    # -- what the ring tells the supervisor ---------------------------------------------
    def look(self) -> None:
        """What needs the share, done by the caller (the supervisor's loop): the ports of
        the nodes this one sends to, and the word of a predecessor that went silent."""
        if len(self.names) < 2:
            return
        self._resolve_heard()
        target = self._next(+1)
        if target is not None and target not in self.targets:
            port = self.ports.get(target)
            if port is None:
                state = self._read(target)
                if state and state.get("state") == "ended":
                    self._adopt(target, state)
                elif state and isinstance(state.get("ring_port"), int):
                    port = state["ring_port"]
            if port is not None:
                try:
                    self.targets[target] = socket.getaddrinfo(
                        self.addresses[target], port, self.family, socket.SOCK_DGRAM)[0][4]
                    _say(f"beats go to {target} at {self.targets[target]}")
                except OSError as exc:   # not resolved for now: tried again at the next look
                    _say(f"{target} ({self.addresses[target]}) not resolved: {exc}")
        pred = self._next(-1)
        now = time.monotonic()
        with self.lock:
            if pred is None:
                self.watching = None
                return
            if self.watching is None or self.watching[0] != pred:
                self.watching = (pred, now)
            since = max(self.heard.get(pred, (0.0, 0.0))[0], self.watching[1])
            never = pred not in self.heard
        if never and pred not in self.started_ok and now - since > 3 * BEAT \
                and now >= self.next_read:
            # Not heard yet: its file says whether it started (then PEER_TIMEOUT holds, not
            # PEER_START) or already ended (before this node started).
            self.next_read = now + 5 * BEAT
            state = self._read(pred)
            if state and state.get("state") == "ended":
                self._adopt(pred, state)
                return
            if state and state.get("state") == "running":
                self.started_ok.add(pred)
        limit = PEER_START if never and pred not in self.started_ok else PEER_TIMEOUT
        if now - since > limit:
            state = self._read(pred)
            if state and state.get("state") == "ended":
                self._adopt(pred, state)
                return
            with self.lock:
                heard = self.heard.get(pred)
                self.lost.setdefault(pred, {"by": self.me, "silent_s": round(now - since, 1),
                                            "heard_at": heard[1] if heard else None})
            _say(f"{pred} lost: silent on the network for {now - since:.0f} s" if heard else
                 f"{pred} lost: never heard from over UDP (at {self.addresses[pred]}): if it "
                 "runs, is UDP open between the cluster's nodes?")
            self._send()

    def quiet(self) -> float | None:
        """Seconds since the freshest progress any node reported, as this node knows it;
        None until a peer has been heard (inf with no peers)."""
        if len(self.names) < 2:
            return float("inf")
        with self.lock:
            if not self.heard or self.progress_at is None:
                return None
            return max(0.0, time.monotonic() - self.progress_at)

    def peers_status(self) -> dict[str, dict]:
        with self.lock:
            return {n: dict(s) for n, s in self.status.items() if n != self.me}

    def heard_at(self) -> dict[str, float]:
        """When each node this one heard from was last heard (wall clock)."""
        with self.lock:
            return {n: round(wall, 3) for n, (_, wall) in self.heard.items()}

    def lost_peers(self) -> dict[str, dict]:
        with self.lock:
            return {n: dict(c) for n, c in self.lost.items() if n != self.me}

    # -- the beats ----------------------------------------------------------------------
    def _loop(self) -> None:
        due = time.monotonic()
        while not self.closed.is_set():
            wait = max(0.0, due - time.monotonic())
            data = None
            try:
                ready, _, _ = select.select([self.sock, self.wake], [], [], wait)
                if self.wake in ready:
                    return
                if ready:
                    data, sender = self.sock.recvfrom(MAX_DATAGRAM)
            except OSError:
                if self.closed.is_set():
                    return
            if data is not None and self._receive(data, sender):
                self._send()   # news: on at once
            if time.monotonic() >= due:
                self._send()
                due = time.monotonic() + BEAT

    def _receive(self, data: bytes, sender: tuple) -> bool:
        """Take in a beat; True if it brought news this node did not have and the others
        must have now (_urgent). A datagram that is not one of the run's own beats is
        rejected (counted, logged) and changes nothing."""
        beat = self._authentic(data, sender)
        if beat is None:
            return False
        now = time.monotonic()
        news = False
        with self.lock:
            self.counters.received += 1
            self.heard[beat["n"]] = (now, time.time())
            self.senders[beat["n"]] = sender
            q = beat.get("q")
            if isinstance(q, (int, float)):
                at = now - q
                self.progress_at = max(self.progress_at or at, at)
            for name, word in (beat.get("s") or {}).items():
                if name in self.addresses and name != self.me and isinstance(word, dict) \
                        and int(word.get("v", 0)) > int(self.status.get(name, {}).get("v", 0)):
                    self.status[name] = word
                    news = news or _urgent(word)
            for name, claim in (beat.get("l") or {}).items():
                if name in self.addresses and name not in self.lost and isinstance(claim, dict):
                    self.lost[name] = claim
                    news = True
        return news

    def _authentic(self, data: bytes, sender: tuple) -> dict | None:
        """DATA as a beat of this run from the node it names, new to this node; None (and
        the datagram rejected: counted and logged) otherwise."""
        beat, why = self._check(data, sender)
        if why is None:
            return beat
        with self.lock:
            self.counters.rejected += 1
            line = self.rejections.line(self.counters.rejected, sender, why)
        if line:
            _say(line)
        return None

    def _check(self, data: bytes, sender: tuple) -> tuple[dict, str | None]:
        """(the beat, None), or why DATA is not one to act on."""
        content = unseal(self.key, data)
        if content is None:
            return {}, "its MAC is not this run's"
        try:
            beat = json.loads(content)
        except ValueError:
            return {}, "not a beat"
        if not isinstance(beat, dict):
            return {}, "not a beat"
        name = beat.get("n")
        if beat.get("r") != self.run or name not in self.addresses or name == self.me:
            return {}, f"it names run {beat.get('r')!r}, node {name!r}"
        ips = self.ips.get(name)
        if ips and _plain_ip(sender[0]) not in ips:
            return {}, f"it names {name}, whose address is {', '.join(sorted(ips))}"
        seq = beat.get("c")
        with self.lock:
            if not isinstance(seq, int) or seq <= self.last_seq.get(name, -1):
                return {}, f"a replay of {name}'s beat {seq}"
            self.last_seq[name] = seq
        return beat, None

    def _resolve_heard(self) -> None:
        """The addresses each neighbour's beats, and any other peer's heard, may come from:
        its cluster address, resolved here in the supervisor's loop, never in the beats'
        thread (a slow DNS must not hold the beats up), and not before torchrun has started
        (all 63 peers resolved at the start cost a 64-node launch a second). A peer not
        resolved yet is taken on its beats' MAC alone; tried again at the next look."""
        with self.lock:
            heard = list(self.heard)
        near = [n for n in (self._next(-1), self._next(+1)) if n is not None]
        for name in {*near, *heard} - {self.me}:
            if name in self.ips:
                continue
            try:
                found = {_plain_ip(str(a[4][0])) for a in socket.getaddrinfo(
                    self.addresses[name], None, type=socket.SOCK_DGRAM)}
            except OSError:
                continue
            with self.lock:
                self.ips[name] = found

    def _send(self, back: bool = False) -> None:
        """A beat to the next live node (BACK: to the previous one, where its beats came
        from)."""
        if back:
            pred = self._next(-1)
            address = self.senders.get(pred) if pred else None
        else:
            target = self._next(+1)
            address = self.targets.get(target) if target else None
        if address is None or self.sock.fileno() < 0:
            return
        # Numbered and sent under the lock: the numbers leave this node in order, and a
        # receiver takes a lower number than one it has heard for a replay.
        with self.lock:
            q = None if self.progress_at is None else round(
                max(0.0, time.monotonic() - self.progress_at), 2)
            self.seq += 1
            beat = {"r": self.run, "n": self.me, "c": self.seq, "q": q, "s": self.status,
                    "l": self.lost}
            data = seal(self.key, json.dumps(beat, separators=(",", ":")).encode())
            try:
                self.sock.sendto(data, address)
                self.counters.sent += 1
            except OSError:
                pass   # unreachable for now: the next beat tries again

    def _next(self, step: int) -> str | None:
        """The nearest node after (+1) or before (-1) this one that has not ended and was
        not found lost; None when every other node has."""
        i = self.names.index(self.me)
        with self.lock:
            for k in range(1, len(self.names)):
                name = self.names[(i + step * k) % len(self.names)]
                if name not in self.lost and \
                        self.status.get(name, {}).get("state") != "ended":
                    return name
        return None

    def _read(self, name: str) -> dict | None:
        self.counters.share_reads += 1
        state = self.lookup(name)
        return state if isinstance(state, dict) else None

    def _adopt(self, name: str, state: dict) -> None:
        """A node's end read on the share: news, as if it had said it."""
        word = {k: state.get(k) for k in ("state", "reason", "code", "why", "timed_out")
                if state.get(k) is not None}
        with self.lock:
            if self.status.get(name, {}).get("state") == "ended":
                return
            self.status[name] = {**word, "v": 1 << 30}
        self._send()


class Rejections:
    """What the supervisor's log says of rejected datagrams: each of the first few, with
    its source and why; then one line a minute with the count (a flood must not fill the
    log)."""

    def __init__(self) -> None:
        self.said_at = 0.0

    def line(self, count: int, sender: tuple, why: str) -> str | None:
        now = time.monotonic()
        if count > SAID_REJECTIONS and now - self.said_at < REJECTION_EVERY:
            return None
        self.said_at = now
        return (f"rejected a datagram from {sender[0]}:{sender[1]}: {why} "
                f"({count} rejected so far; nothing acted on)")


def _plain_ip(address: str) -> str:
    """An address as a peer's resolved address reads (an IPv4 one seen on an IPv6 socket
    as itself)."""
    return address[7:] if address.startswith("::ffff:") else address


def ring_socket(addresses: list[str], ports: range | None = None) -> socket.socket:
    """This node's UDP socket for the ring: on the first free port of PORTS (the
    cluster's ring ports, which the firewall opens between members), else one of the
    system's choosing (said: a firewall that opens only PORTS drops its beats)."""
    family = socket.AF_INET6 if any(":" in a for a in addresses) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    for port in ports or ():
        try:
            sock.bind(("", port))
            return sock
        except OSError:
            continue
    if ports:
        _say(f"no free ring port in {ports.start}-{ports.stop - 1} (`ss -ulpn` shows who "
             "holds them): this run's beats use another; a firewall that opens only those "
             "ports between the nodes drops them")
    sock.bind(("", 0))
    return sock


def _say(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)   # into supervisor.log


def _urgent(word: dict) -> bool:
    """Whether a node's word must go on at once: it found the run hung, or its part ended
    for a cause of its own. A node that finished well, or that stopped because of another
    node (whose own word went round first), rides on the next beats: at the end of a run
    of N nodes, N such words passed on at once would cost every node N datagrams."""
    if word.get("hang") == "dumped":
        return True
    if word.get("state") != "ended":
        return False
    reason = word.get("reason")
    return not ((reason == "exited" and word.get("code") == 0)
                or reason in ("peer-failed", "peer-stopped", "peer-lost"))


def resolve(names: list[str], addresses: list[str] | None) -> list[str]:
    """Each node's address as a peer reaches it: the controller's (its cluster address),
    else the node's name."""
    if addresses and len(addresses) == len(names):
        return list(addresses)
    return list(names)


def read_state(state_dir: str, name: str) -> dict | None:
    data = read_json(os.path.join(state_dir, f"{name}.json"))
    return data if isinstance(data, dict) else None
