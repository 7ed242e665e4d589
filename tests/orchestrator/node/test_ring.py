"""The supervisors' ring (node/ring.py), run for real on this machine: real UDP sockets on
the loopback, a dictionary standing in for the nodes' state files on the share."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.node import ring as ring_mod
from orchestrator.node.ring import Counters, Ring

KEY = b"k" * 32   # the run's ring key (the launch makes a random one)


def make(names: list[str], files: dict[str, dict],
         lookup: Callable[[str], dict | None] | None = None) -> dict[str, Ring]:
    rings = {n: Ring("r1", n, names, ["127.0.0.1"] * len(names),
                     lookup or files.get, Counters(), KEY) for n in names}
    for name, r in rings.items():
        files[name] = {"state": "running", "ring_port": r.port}
    for r in rings.values():
        r.start()
    return rings


def until(check: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)


def all_heard(rings: dict[str, Ring]) -> bool:
    for r in rings.values():
        r.look()   # the supervisor's loop does this every beat
    return all(r.heard for r in rings.values())


@pytest.fixture
def closing():
    made: list[Ring] = []
    yield made
    for r in made:
        r.close()


def test_a_failure_goes_round_the_ring_at_once(closing) -> None:
    files: dict[str, dict] = {}
    rings = make([f"n{i}" for i in range(5)], files)
    closing.extend(rings.values())
    until(lambda: all_heard(rings))
    t0 = time.monotonic()
    rings["n2"].say(state="ended", reason="exited", code=1, why="")
    # n1 is the last to hear (four hops on): well before the next beat.
    until(lambda: rings["n1"].peers_status().get("n2", {}).get("code") == 1, timeout=0.9)
    assert time.monotonic() - t0 < 0.9


def test_a_silent_predecessor_is_lost_unless_its_file_says_it_ended(
        closing, monkeypatch) -> None:
    monkeypatch.setattr(ring_mod, "PEER_TIMEOUT", 1.5)
    files: dict[str, dict] = {}
    rings = make(["n0", "n1", "n2"], files)
    closing.extend(rings.values())
    until(lambda: all_heard(rings))
    # n0 ends well, its datagrams lost: its file says so, and it is not lost.
    files["n0"] = {"state": "ended", "reason": "exited", "code": 0}
    rings["n0"].close()
    time.sleep(2)
    rings["n1"].look()
    assert rings["n1"].lost_peers() == {}
    assert rings["n1"].peers_status()["n0"]["state"] == "ended"
    # n1 dies without a word: n2 names it lost, and n0... has ended: n2 is alone.
    rings["n1"].close()
    time.sleep(2)
    rings["n2"].look()
    assert set(rings["n2"].lost_peers()) == {"n1"}
    assert rings["n2"].lost_peers()["n1"]["by"] == "n2"


def test_a_stalled_share_holds_up_the_look_not_the_beats(closing, monkeypatch) -> None:
    """The share blocks (every read waits): the supervisor's look waits with it, and the
    beats go on, so no peer takes this node for lost."""
    monkeypatch.setattr(ring_mod, "PEER_TIMEOUT", 1.5)
    files: dict[str, dict] = {}
    stalled = threading.Event()
    released = threading.Event()

    def lookup(name: str) -> dict | None:
        if stalled.is_set():
            released.wait()
        return files.get(name)

    rings = make(["n0", "n1"], files, lookup)
    closing.extend(rings.values())
    until(lambda: all_heard(rings))
    stalled.set()
    n0 = rings["n0"]
    looking = threading.Thread(target=n0._read, args=("n1",), daemon=True)
    looking.start()   # n0's supervisor, blocked in the share
    sent = n0.counters.sent
    time.sleep(3)
    assert looking.is_alive()
    assert n0.counters.sent >= sent + 2   # n0 went on beating meanwhile
    rings["n1"].look()
    assert rings["n1"].lost_peers() == {}
    released.set()
    looking.join(timeout=5)


def test_a_node_held_up_itself_gives_its_peers_a_fresh_timeout(closing, monkeypatch) -> None:
    # 3 s, not 1: a test process held up for a second between forgive() and look() (CI's
    # two cores, busy with site.yml) would see the fresh timeout pass.
    monkeypatch.setattr(ring_mod, "PEER_TIMEOUT", 3.0)
    files: dict[str, dict] = {}
    rings = make(["n0", "n1"], files)
    closing.extend(rings.values())
    until(lambda: all_heard(rings))
    n0 = rings["n0"]
    n0.heard["n1"] = (time.monotonic() - 10, time.time() - 10)
    n0.watching = ("n1", time.monotonic() - 10)
    n0.closed.set()   # n0's own beats and receipts stop: it was held up
    n0.thread.join()
    n0.heard["n1"] = (time.monotonic() - 10, time.time() - 10)
    n0.forgive()
    n0.look()
    assert n0.lost_peers() == {}
    time.sleep(3.2)
    n0.look()
    assert set(n0.lost_peers()) == {"n1"}


def test_the_runs_quiet_is_the_freshest_progress_anywhere(closing) -> None:
    files: dict[str, dict] = {}
    rings = make(["n0", "n1", "n2"], files)
    closing.extend(rings.values())
    assert rings["n0"].quiet() is None   # nothing heard yet
    rings["n0"].progress(100.0)
    rings["n1"].progress(100.0)
    rings["n2"].progress(2.0)            # n2's ranks printed 2 s ago
    until(lambda: all_heard(rings) and all((r.quiet() or 99) < 10 for r in rings.values()),
          timeout=8)
    assert (rings["n0"].quiet() or 99) < 10   # n0's own ranks: quiet for 100 s


def test_a_node_that_finished_is_passed_at_once_by_the_one_before(closing) -> None:
    """n1 finished well: it tells n2 and n0 alike, so n0 sends past it to n2 at once
    (not once the word went round the ring, which takes a beat a node: longer than
    PEER_TIMEOUT at 64 nodes, and n2 would take n0 for lost)."""
    files: dict[str, dict] = {}
    rings = make([f"n{i}" for i in range(4)], files)
    closing.extend(rings.values())
    until(lambda: all_heard(rings))
    rings["n1"].last_word(state="ended", reason="exited", code=0, why="")
    until(lambda: rings["n0"].peers_status().get("n1", {}).get("state") == "ended",
          timeout=0.5)
    n2 = rings["n2"]
    until(lambda: all_heard({n: r for n, r in rings.items() if n != "n1"})
          and "n0" in n2.heard and time.monotonic() - n2.heard["n0"][0] < 0.5, timeout=3)


def test_a_last_word_is_said_at_once_and_repeated_without_holding_up_the_end(closing) -> None:
    """A node's last word leaves at once, and its repeats (datagrams can be lost) follow on
    a thread of their own: the supervisor records its end meanwhile (it waited for them,
    a fifth of a second on every run's end). close() sends them all before it stops."""
    files: dict[str, dict] = {}
    rings = make([f"n{i}" for i in range(3)], files)
    closing.extend(rings.values())
    until(lambda: all_heard(rings))
    n1 = rings["n1"]
    sent = n1.counters.sent
    t0 = time.monotonic()
    n1.last_word(state="ended", reason="exited", code=0, why="")
    assert time.monotonic() - t0 < ring_mod.BEAT / 20   # not a repeat waited for
    until(lambda: rings["n2"].peers_status().get("n1", {}).get("state") == "ended",
          timeout=0.5)
    n1.close()
    # To n2 and back to n0, each time (beats of n1's own may come on top).
    assert n1.counters.sent - sent >= 2 * ring_mod.FINAL_REPEATS


def test_two_runs_on_the_same_nodes_do_not_hear_each_other(closing) -> None:
    """Two users' runs on the same two nodes, the second's beats sent to the first's ports
    (a port the first run holds, taken for the second's by a stale state file): the first
    run neither hears the second's nodes nor takes in its failure."""
    names = ["n0", "n1"]
    files: dict[str, dict] = {}
    first = make(names, files)
    closing.extend(first.values())
    other = {n: Ring("r2", n, names, ["127.0.0.1"] * 2, lambda _: None, Counters(), KEY,
                     ports={m: first[m].port for m in names}) for n in names}
    closing.extend(other.values())
    for r in other.values():
        r.start()
    until(lambda: all_heard(first))
    for r in other.values():
        r.look()   # the other run's beats now go to the first run's ports
    assert all(r.targets for r in other.values())
    received = {n: r.counters.received for n, r in first.items()}
    other["n0"].say(state="ended", reason="exited", code=1, why="")
    time.sleep(2.5)   # two beats of the other run, and its failure, sent to the first's ports
    for r in first.values():
        r.look()
        assert r.peers_status() == {} and r.lost_peers() == {}
    # the first run's own beats still count, the other's were dropped unread
    assert all(first[n].counters.received - received[n] <= 4 for n in names)
    assert all(r.counters.received == 0 for r in other.values())


def forged(run: str, name: str, news: dict[str, Any], seq: int = 10**9) -> bytes:
    """A beat as another user could write it: the run id, the node names and the ports
    are public (ps, /proc/net/udp); the key is not."""
    beat = {"r": run, "n": name, "c": seq, "q": 0.0, "s": {}, "l": {}, **news}
    return json.dumps(beat).encode()


# Every kind of news a beat carries, each of which would stop, fail or cordon the run.
NEWS: dict[str, dict[str, Any]] = {
    "failed": {"s": {"n1": {"state": "ended", "reason": "exited", "code": 1, "v": 99}}},
    "supervisor failed": {"s": {"n1": {"state": "ended", "reason": "supervisor-failed",
                                       "code": 1, "v": 99}}},
    "hung": {"s": {"n1": {"state": "running", "hang": "dumped", "v": 99}}},
    "stopped": {"s": {"n1": {"state": "ended", "reason": "stopped", "v": 99}}},
    "lost": {"l": {"n2": {"by": "n1", "silent_s": 20}}},
}


@pytest.mark.parametrize("kind", NEWS)
def test_a_forged_beat_is_rejected_and_changes_nothing(closing, kind, capsys) -> None:
    files: dict[str, dict] = {}
    rings = make(["n0", "n1", "n2"], files)
    closing.extend(rings.values())
    until(lambda: all_heard(rings))
    target = rings["n2"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as bob:
        # Without the key: the content alone, and behind a MAC made with another key.
        bob.sendto(forged("r1", "n1", NEWS[kind]), ("127.0.0.1", target.port))
        bob.sendto(ring_mod.seal(b"b" * 32, forged("r1", "n1", NEWS[kind])),
                   ("127.0.0.1", target.port))
    until(lambda: target.counters.rejected >= 2)
    time.sleep(0.3)   # anything it would have passed on is there by now
    for r in rings.values():
        assert r.lost_peers() == {}
        assert all(s.get("state") != "ended" and not s.get("hang")
                   for s in r.peers_status().values()), r.me
    assert "rejected a datagram from 127.0.0.1:" in capsys.readouterr().out


def test_a_beat_from_another_address_than_its_nodes_is_rejected(closing) -> None:
    """With the key, but sent from an address that is not the named node's (127.0.0.2
    while every node is 127.0.0.1): not taken in."""
    files: dict[str, dict] = {}
    rings = make(["n0", "n1"], files)
    closing.extend(rings.values())
    until(lambda: all_heard(rings))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        other.bind(("127.0.0.2", 0))
        other.sendto(ring_mod.seal(KEY, forged("r1", "n1", NEWS["failed"])),
                     ("127.0.0.1", rings["n0"].port))
    until(lambda: rings["n0"].counters.rejected >= 1)
    assert "n1" not in rings["n0"].peers_status() or \
        rings["n0"].peers_status()["n1"].get("state") != "ended"


def test_a_replayed_beat_is_rejected(closing) -> None:
    """A beat of the run sent again (the same bytes: its number already heard) is not
    taken in a second time, whatever it says."""
    files: dict[str, dict] = {}
    rings = make(["n0", "n1"], files)
    closing.extend(rings.values())
    until(lambda: all_heard(rings))
    heard = rings["n0"].last_seq["n1"]
    old = ring_mod.seal(KEY, forged("r1", "n1", NEWS["failed"], seq=heard))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as again:
        again.sendto(old, ("127.0.0.1", rings["n0"].port))
    until(lambda: rings["n0"].counters.rejected >= 1)
    assert rings["n0"].peers_status().get("n1", {}).get("state") != "ended"


def test_the_runs_own_beats_are_never_rejected(closing) -> None:
    files: dict[str, dict] = {}
    rings = make([f"n{i}" for i in range(4)], files)
    closing.extend(rings.values())
    until(lambda: all_heard(rings))
    time.sleep(2.5)
    rings["n1"].say(state="ended", reason="exited", code=1, why="")
    until(lambda: rings["n0"].peers_status().get("n1", {}).get("code") == 1)
    assert sum(r.counters.rejected for r in rings.values()) == 0
    assert all(r.counters.received >= 2 for r in rings.values())


def test_a_ring_key_too_short_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        Ring("r1", "n0", ["n0"], ["127.0.0.1"], lambda _: None, Counters(), b"short")


@pytest.mark.parametrize("ports", ["29700-29899", "1024-1024", "65535-65535", "1023-2000",
                                   "29899-29700", "29700", "a-b", "29700-70000", " 1-2", ""])
def test_the_supervisor_reads_ring_ports_by_the_firewalls_rule(ports) -> None:
    """The node package cannot import the collection's rule (plugins/module_utils): its
    own reading of cluster_ring_ports must accept and refuse exactly what the firewall
    role (and the controller's inventory check) does."""
    from orchestrator import contract
    from orchestrator.node.protocol import parse_ports

    def accepted(read: Callable[[str], object]) -> bool:
        try:
            read(ports)
            return True
        except ValueError:
            return False

    assert accepted(parse_ports) == accepted(contract.rules().port_range)


def test_a_closed_ring_ends_at_once_not_at_its_next_beat(closing, monkeypatch) -> None:
    """A supervisor closes its ring when its part ends, and only then writes its end for
    the controller: a ring that waited for its next beat to notice would hold up every
    node's end, and so every run's, by up to a beat (here a beat of a minute)."""
    monkeypatch.setattr(ring_mod, "BEAT", 60.0)
    files: dict[str, dict] = {}
    rings = make(["a", "b"], files)
    closing.extend(rings.values())
    until(lambda: rings["a"].thread.is_alive())
    time.sleep(0.3)   # waiting for its next beat
    started = time.monotonic()
    rings["a"].close()
    assert time.monotonic() - started < 5.0
    assert not rings["a"].thread.is_alive()
