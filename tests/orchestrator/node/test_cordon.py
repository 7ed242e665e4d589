"""The share's cordon record (roles/slurm/files/cordon.py, the module
orchestrator.node.cordon), on a real directory: a node's newest event decides, events by two users
never overwrite each other, a share without the record's directory is named with its fix;
an event's author is its file's owner and its time the file's mtime, whatever the file
says, a date in the future is refused, and a cordon is lifted only by its author or an
admin. Where another user is needed (files of other owners, a verb run as another user,
the Slurm helper run for one through sudo) the tests run as root and act as the system's
users daemon (uid 1) and bin (uid 2). The record on the sandbox's share, read by
preflight: tests/e2e/test_cluster.py::test_killed_node_then_provision_again_and_resume;
bob's forged files there: tests/security/test_cordon_sandbox.py."""

from __future__ import annotations

import getpass
import grp
import json
import os
import pwd
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from orchestrator.node import cordon

REPO = Path(__file__).resolve().parents[3]
FILES = REPO / "roles" / "slurm" / "files"
DAEMON, BIN = 1, 2   # two users every Debian system has: not root, nor each other
NODE_PYTHON = "/usr/bin/python3"   # a node's system python, which every user may run
as_root = pytest.mark.skipif(os.geteuid() != 0 or not os.access(NODE_PYTHON, os.X_OK),
                             reason="files of other owners need root (and a system python)")


@pytest.fixture
def share(tmp_path: Path) -> str:
    (tmp_path / cordon.CORDONS_SUBDIR).mkdir(mode=0o1777)
    return str(tmp_path)


def test_the_newest_event_decides(share: str) -> None:
    assert cordon.current(share, "node1") is None
    cordon.record(share, "node1", cordon.CORDON, "lost mid-run r1", run="r1", now=100.0)
    got = cordon.current(share, "node1")
    assert got is not None and got["why"] == "lost mid-run r1" and got["run"] == "r1"
    assert got["by"] == pwd.getpwuid(os.geteuid()).pw_name == getpass.getuser()
    assert got["since"] == "1970-01-01T00:01:40+00:00"
    cordon.record(share, "node1", cordon.UNCORDON, "fixed", now=200.0)
    assert cordon.current(share, "node1") is None
    cordon.record(share, "node1", cordon.CORDON, "lost again", now=300.0)
    assert (cordon.current(share, "node1") or {}).get("why") == "lost again"
    # Nothing was overwritten: three events, three files.
    assert len(list(Path(share, cordon.CORDONS_SUBDIR).iterdir())) == 3


def test_one_nodes_events_are_not_anothers(share: str) -> None:
    cordon.record(share, "node10", cordon.CORDON, "a bad fan", now=100.0)
    cordon.record(share, "node1", cordon.CORDON, "lost", now=50.0)
    cordon.record(share, "node1", cordon.UNCORDON, "fixed", now=150.0)
    assert cordon.current(share, "node1") is None
    assert (cordon.current(share, "node10") or {}).get("why") == "a bad fan"
    assert list(cordon.cordoned(share)) == ["node10"]


def test_a_file_that_does_not_read_is_left_out(share: str) -> None:
    cordon.record(share, "node1", cordon.CORDON, "lost", now=100.0)
    where = Path(share, cordon.CORDONS_SUBDIR)
    (where / "node1@200000000000@mallory.json").write_text("{cut short")
    (where / "node1@300000000000@mallory.json").write_text(json.dumps(["not", "an", "event"]))
    assert (cordon.current(share, "node1") or {}).get("why") == "lost"


def test_a_share_without_the_record_says_how_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(cordon.NoRecord, match="run site.yml"):
        cordon.record(str(tmp_path), "node1", cordon.CORDON, "lost")
    assert cordon.current(str(tmp_path), "node1") is None
    said = cordon.main({"share": str(tmp_path), "node": "node1", "action": "cordon",
                        "why": "x"})
    assert "cordons does not exist" in said["error"]


def test_the_author_is_the_files_owner_not_what_it_says(share: str) -> None:
    """A file named for alice, saying alice: its author is whoever wrote it."""
    forged = Path(share, cordon.CORDONS_SUBDIR, "node1@100000000000@alice.json")
    forged.write_text(json.dumps({"node": "node1", "action": "cordon", "why": "mine",
                                  "by": "alice", "time": 100.0,
                                  "since": "1970-01-01T00:01:40+00:00"}))
    got = cordon.current(share, "node1") or {}
    assert (got["by"], got["held_by"]) == (getpass.getuser(), [getpass.getuser()]), got
    assert got["since"] != "1970-01-01T00:01:40+00:00"   # its mtime: now


@as_root
def test_an_owner_the_node_does_not_know_is_named_by_uid(share: str) -> None:
    cordon.record(share, "node1", cordon.CORDON, "lost", now=100.0)
    (path,) = Path(share, cordon.CORDONS_SUBDIR).iterdir()
    os.chown(path, 4242, 4242)
    assert (cordon.current(share, "node1") or {}).get("by") == "uid 4242"


def test_an_event_dated_in_the_future_decides_nothing_and_is_said(share: str) -> None:
    cordon.record(share, "node1", cordon.CORDON, "lost", now=time.time() - 60)
    cordon.record(share, "node1", cordon.UNCORDON, "fixed", now=time.time() - 30)
    far = time.mktime((2100, 1, 1, 0, 0, 0, 0, 0, 0))
    cordon.record(share, "node1", cordon.CORDON, "forever", now=far)
    cordon.record(share, "node2", cordon.CORDON, "bad fan", now=far)
    assert cordon.current(share, "node1") is None and cordon.cordoned(share) == {}
    listed = cordon.main({"share": share})
    assert listed["cordoned"] == {}
    assert sorted(i["why"][:11] for i in listed["ignored"]) == ["dated 2100-"] * 2, listed
    assert all(i["why"].endswith("in the future") and i["by"] == getpass.getuser()
               for i in listed["ignored"])


def test_a_file_dated_tomorrow_is_refused_tomorrow_too(share: str) -> None:
    """Its mtime lies past its ctime, which only a `touch -d` makes (the server sets the
    ctime): once its date has come it is still not believed."""
    tomorrow = time.time() + 86400
    cordon.record(share, "node1", cordon.CORDON, "scheduled", now=tomorrow)
    events, ignored = cordon.read(share, "node1", now=tomorrow + 3600)
    assert events == [] and [i.why.endswith("in the future") for i in ignored] == [True]
    # Within the clocks' skew an event is believed.
    cordon.record(share, "node2", cordon.CORDON, "soon", now=time.time() + 60)
    assert (cordon.current(share, "node2") or {}).get("why") == "soon"


def test_a_file_whose_name_and_content_name_other_nodes_is_refused(share: str) -> None:
    where = Path(share, cordon.CORDONS_SUBDIR)
    (where / "node1@100000000000@me.json").write_text(
        json.dumps({"node": "node2", "action": "cordon", "why": "which one?"}))
    (where / "node3.json").write_text(json.dumps({"node": "node3", "action": "cordon"}))
    assert cordon.cordoned(share) == {}
    whys = sorted(i["why"] for i in cordon.main({"share": share})["ignored"])
    assert whys == ["its content names node 'node2', its file name 'node1'",
                    "not named NODE@TIME_NS@USER.json"]


@pytest.mark.timeout(30)
def test_a_planted_pipe_or_link_neither_hangs_nor_fools_a_reader(share: str,
                                                                 tmp_path: Path) -> None:
    where = Path(share, cordon.CORDONS_SUBDIR)
    os.mkfifo(where / "node1@100000000000@me.json")
    elsewhere = tmp_path / "event.json"
    elsewhere.write_text(json.dumps({"node": "node2", "action": "cordon", "why": "x"}))
    (where / "node2@100000000000@me.json").symlink_to(elsewhere)
    started = time.monotonic()
    assert cordon.cordoned(share) == {}
    assert time.monotonic() - started < 5
    whys = sorted(i["why"] for i in cordon.main({"share": share})["ignored"])
    assert whys[0].startswith("cannot be read") and whys[1] == "not an event file", whys


def test_an_event_is_readable_by_every_user_whatever_the_umask(share: str) -> None:
    """A detached run's recovery writes under umask 077: its cordon is every user's too."""
    old = os.umask(0o077)
    try:
        cordon.record(share, "node1", cordon.CORDON, "lost mid-run r1", run="r1")
    finally:
        os.umask(old)
    (path,) = Path(share, cordon.CORDONS_SUBDIR).iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def event(node: str, action: str, uid: int, at: float) -> cordon.Event:
    return cordon.Event(node, action, "", None, uid, at, f"{node}@{at}@{uid}.json")


def test_only_the_author_or_an_admin_lifts_a_cordon() -> None:
    """The rule on events: bob's uncordon of alice's cordon is ignored (and said), his own
    lifts his; an admin's lifts every one; a later cordon is not lifted by an earlier
    uncordon."""
    alice, bob, admin = 1001, 1002, 1003
    admins = {admin}.__contains__
    state = cordon.decide([event("n1", "cordon", alice, 1), event("n1", "uncordon", bob, 2)],
                          admins)["n1"]
    assert [c.uid for c in state.held] == [alice] and [u.uid for u in state.refused] == [bob]
    state = cordon.decide([event("n1", "cordon", alice, 1), event("n1", "cordon", bob, 2),
                           event("n1", "uncordon", bob, 3)], admins)["n1"]
    assert [c.uid for c in state.held] == [alice] and [c.uid for c in state.lifted] == [bob]
    assert state.refused == []
    state = cordon.decide([event("n1", "cordon", alice, 1), event("n1", "cordon", bob, 2),
                           event("n1", "uncordon", admin, 3), event("n1", "cordon", bob, 4)],
                          admins)["n1"]
    assert [c.uid for c in state.held] == [bob] and \
        [c.uid for c in state.lifted] == [alice, bob]


def test_admins_are_root_and_the_groups_members() -> None:
    me = pwd.getpwuid(os.geteuid())
    mine = grp.getgrgid(me.pw_gid).gr_name
    assert cordon.Admins(mine)(os.geteuid()) and cordon.Admins(None)(0)
    assert not cordon.Admins("root")(65534) and not cordon.Admins("no-such-group")(DAEMON)
    assert not cordon.Admins(None)(DAEMON) and cordon.Admins("daemon")(DAEMON)
    assert not cordon.Admins("daemon")(4242)   # no such user


def test_the_default_admin_group_is_the_contracts() -> None:
    defaults = yaml.safe_load((REPO / "roles/contract/defaults/main.yml").read_text())
    assert cordon.DEFAULT_ADMIN_GROUP == defaults["cluster_admin_group"]


# -- two users on one record: files of other owners, verbs run as another user ------------
# (open_share: tests/orchestrator/node/conftest.py)

def verb_as(uid: int, request: dict) -> dict:
    """The node verb `cordon` run by user UID (its own process, its own uid)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import cordon; "
            "print(json.dumps(cordon.main(json.load(sys.stdin))))")
    done = subprocess.run([NODE_PYTHON, "-I", "-c", code, str(FILES)], user=uid,
                          group=pwd.getpwuid(uid).pw_gid, input=json.dumps(request),
                          capture_output=True, text=True, timeout=60, check=True)
    said: dict = json.loads(done.stdout)
    return said


@as_root
def test_an_uncordon_by_another_user_is_refused_and_a_forged_one_lifts_nothing(
        open_share: str) -> None:
    """bin may not lift daemon's cordon: the verb refuses and writes nothing; the file bin
    writes anyway (in daemon's name) is ignored by every reader and said; daemon lifts his
    own."""
    mine = verb_as(DAEMON, {"share": open_share, "node": "node1", "action": "cordon",
                            "why": "bad fan"})
    assert mine["event"]["by"] == "daemon", mine
    said = verb_as(BIN, {"share": open_share, "node": "node1", "action": "uncordon",
                         "admin_group": "sudo"})
    assert said == {"refused": f"node1 is cordoned by daemon since {mine['event']['since']} "
                    "(bad fan); bin may not lift it: only an admin (a member of group "
                    "'sudo') or daemon, who cordoned it, may"}, said
    assert len(os.listdir(cordon.cordons_dir(open_share))) == 1
    subprocess.run([NODE_PYTHON, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]);"
                    " import cordon; cordon.record(sys.argv[2], 'node1', 'uncordon', 'x')",
                    str(FILES), open_share], user=BIN, check=True, timeout=60)
    listed = cordon.main({"share": open_share, "admin_group": "sudo"})
    assert listed["cordoned"]["node1"]["by"] == "daemon", listed
    assert [i["by"] for i in listed["ignored"]] == ["bin"], listed
    assert "may not lift its cordon" in listed["ignored"][0]["why"]
    back = verb_as(DAEMON, {"share": open_share, "node": "node1", "action": "uncordon"})
    assert [c["by"] for c in back["lifted"]] == ["daemon"] and back["held"] == [], back
    assert cordon.cordoned(open_share) == {}


@as_root
def test_an_admin_lifts_another_users_cordon(open_share: str) -> None:
    verb_as(BIN, {"share": open_share, "node": "node1", "action": "cordon", "why": "disk"})
    assert verb_as(DAEMON, {"share": open_share, "node": "node1", "action": "uncordon",
                            "admin_group": "bin"})["refused"]
    said = verb_as(DAEMON, {"share": open_share, "node": "node1", "action": "uncordon",
                            "admin_group": "daemon"})
    assert [c["by"] for c in said["lifted"]] == ["bin"], said
    # Each reader decides by its own admin group: a reader who does not count daemon as
    # an admin still sees bin's cordon.
    assert cordon.cordoned(open_share, "daemon") == {}
    assert list(cordon.cordoned(open_share, "sudo")) == ["node1"]


# -- Slurm's helper: the slurm role's clustertrain-drain, rendered, run as through sudo ----

@pytest.fixture
def scontrol(tmp_path: Path) -> Path:
    """A stand-in for scontrol: logs its arguments; `show node` prints SHOW's text."""
    (tmp_path / "show").write_text("NodeName=node1 Arch=x86_64\n   State=IDLE ThreadsPerCore=1\n")
    program = tmp_path / "scontrol"
    program.write_text(f"""#!/bin/sh
echo "$*" >> {tmp_path}/calls
[ "$1" = show ] && cat {tmp_path}/show
exit 0
""")
    program.chmod(0o755)
    return program


def drained(scontrol: Path, reason: str) -> None:
    scontrol.with_name("show").write_text(
        f"NodeName=node1 Arch=x86_64\n   State=IDLE+DRAIN ThreadsPerCore=1\n"
        f"   Reason={reason} [root@2026-11-28T02:00:00]\n")


def helper_as(uid: int, share: str, scontrol: Path, *argv: str
              ) -> subprocess.CompletedProcess[str]:
    """The slurm role's clustertrain-drain, rendered with SHARE, admin group daemon and
    SCONTROL, run by root for user UID (as sudo runs it: SUDO_UID)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO / "roles/slurm/templates"),
                             keep_trailing_newline=True)
    env.filters["to_json"] = json.dumps
    script = scontrol.with_name("clustertrain-drain")
    script.write_text(env.get_template("clustertrain-drain.j2").render(
        ansible_managed="test", slurm_drain_lib_dir=str(FILES), cluster_shared_path=share,
        cluster_admin_group="daemon", slurm_scontrol=str(scontrol)))
    return subprocess.run([sys.executable, "-I", str(script), *argv], capture_output=True,
                          text=True, timeout=60, env={"SUDO_UID": str(uid), "PATH": "/bin"})


def calls(scontrol: Path) -> list[str]:
    log = scontrol.with_name("calls")
    return log.read_text().splitlines() if log.exists() else []


def own(share: str, uid: int) -> None:
    """The record's newest file becomes UID's (as if UID wrote it)."""
    newest = max(Path(cordon.cordons_dir(share)).iterdir(), key=lambda p: p.stat().st_mtime)
    os.chown(newest, uid, uid)


@as_root
def test_a_user_drains_only_a_node_he_cordoned(share: str, scontrol: Path) -> None:
    cordon.record(share, "node1", cordon.CORDON, "bad fan", now=time.time() - 10)
    own(share, DAEMON)
    refused = helper_as(BIN, share, scontrol, "node1", "I say so")
    assert refused.returncode == 1, refused.stderr
    assert "holds no cordon of node1 by bin: a node is drained once it is cordoned" in \
        refused.stderr and calls(scontrol) == []
    done = helper_as(DAEMON, share, scontrol, "node1", "bad fan\x07")
    assert done.returncode == 0, done.stderr
    assert calls(scontrol)[-1] == ("update NodeName=node1 State=DRAIN "
                                   "Reason=clustertrain (daemon): bad fan")
    # A node an admin drained for a reason of his own is left so (its resume is his).
    drained(scontrol, "new DIMMs")
    assert helper_as(DAEMON, share, scontrol, "node1", "bad fan").stdout.strip() == \
        "node1 is drained already (new DIMMs): left as it is"
    assert calls(scontrol)[-1] == "show node node1"
    assert helper_as(DAEMON, share, scontrol, "no/de", "x").returncode == 2


@as_root
def test_a_node_returns_to_slurm_once_its_cordon_is_lifted_by_the_rule(share: str,
                                                                     scontrol: Path) -> None:
    cordon.record(share, "node1", cordon.CORDON, "bad fan", now=time.time() - 20)
    own(share, BIN)
    drained(scontrol, "clustertrain (bin): bad fan")
    still = helper_as(BIN, share, scontrol, "--resume", "node1")
    assert still.returncode == 1 and "node1 is still cordoned by bin in the share's " \
        "record: `uncordon node1` first" in still.stderr, still.stderr
    cordon.record(share, "node1", cordon.UNCORDON, "fixed", now=time.time() - 10)
    own(share, BIN)
    other = helper_as(4242, share, scontrol, "--resume", "node1")
    assert other.returncode == 1 and "uid 4242 may not return node1 to Slurm: only an " \
        "admin (a member of group 'daemon') or the author of its last lifted cordon " \
        "(bin) may" in other.stderr, other.stderr
    assert not [c for c in calls(scontrol) if c.startswith("update")]
    for uid in (BIN, DAEMON):   # its author, an admin
        done = helper_as(uid, share, scontrol, "--resume", "node1")
        assert done.returncode == 0 and done.stdout.strip() == "node1 returned to Slurm"
        assert calls(scontrol)[-1] == "update NodeName=node1 State=RESUME"
    drained(scontrol, "new DIMMs")
    mine = helper_as(BIN, share, scontrol, "--resume", "node1")
    assert mine.returncode == 1 and "node1 is drained for another reason (new DIMMs): an " \
        "admin returns it" in mine.stderr, mine.stderr


# -- one user's flood, another user's escapes ---------------------------------------------

def flood(share: str, uid: int, n: int, nodes: int) -> None:
    """N cordon events by UID, spread over NODES nodes (made-up ones, and node1 the newest),
    as a user writes them by hand: no bound but the directory's."""
    where = Path(cordon.cordons_dir(share))
    for i in range(n):
        node = "node1" if i % nodes == (n - 1) % nodes else f"fake{i % nodes}"
        path = where / f"{node}@{1_000_000_000 + i}000000000@x.json"
        path.write_text(json.dumps({"node": node, "action": "cordon", "why": f"flood {i}"}))
        os.utime(path, (1_000_000_000 + i, 1_000_000_000 + i))
        os.chown(path, uid, uid)


@as_root
@pytest.mark.parametrize("nodes", [1, 3000])
def test_another_users_flood_is_read_no_further_than_his_bound(
        open_share: str, nodes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """3000 of bin's events (of one node, or of 3000) in the record: a listing opens at most
    PER_OWNER of bin's files (his flood costs a reader a bounded read, whatever its size),
    still shows daemon's cordon, and says bin's flood in one line, not 3000. What the flood
    costs a user in time, on the sandbox: bench/cordon_flood.py."""
    verb_as(DAEMON, {"share": open_share, "node": "node2", "action": "cordon", "why": "fan"})
    flood(open_share, BIN, 3000, nodes)
    opened: list[int] = []
    read_one = cordon._read_one

    def counted(fd: int, entry: Any, now: float) -> Any:
        opened.append(entry.info.st_uid)
        return read_one(fd, entry, now)

    monkeypatch.setattr(cordon, "_read_one", counted)
    cordon.listing(open_share, admin_group="sudo")
    assert opened.count(BIN) <= cordon.PER_OWNER and opened.count(DAEMON) == 1, \
        (opened.count(BIN), opened.count(DAEMON))
    listed = verb_as(DAEMON, {"share": open_share, "admin_group": "sudo"})
    assert listed["cordoned"]["node2"]["by"] == "daemon"
    assert listed["cordoned"]["node1"]["by"] == "bin"
    assert len(listed["ignored"]) <= 1, listed["ignored"][:3]


def test_a_writer_keeps_its_own_few_newest_events_of_a_node(share: str) -> None:
    """A user who cordons and uncordons a node again and again leaves its newest few
    events, not one more file each time; the record decides as before."""
    for i in range(4 * cordon.PER_NODE):   # cordon, uncordon, ..., uncordon
        cordon.record(share, "node1", (cordon.CORDON, cordon.UNCORDON)[i % 2], f"#{i}",
                      now=1000.0 + i)
    cordon.record(share, "node2", cordon.CORDON, "other", now=5000.0)
    names = sorted(os.listdir(cordon.cordons_dir(share)))
    assert len([n for n in names if n.startswith("node1@")]) == cordon.PER_NODE
    assert cordon.current(share, "node1") is None
    assert (cordon.current(share, "node2") or {}).get("why") == "other"


def test_a_writer_is_refused_past_its_bound_of_nodes(share: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cordon, "PER_OWNER", 3 * cordon.PER_NODE)
    for node in ("node1", "node2", "node3"):
        cordon.record(share, node, cordon.CORDON, "x")
    with pytest.raises(OSError, match=r"holds events of 3 nodes in .*cordons, the most one "
                                      r"user may \(3\)"):
        cordon.record(share, "node4", cordon.CORDON, "x")
    said = cordon.main({"share": share, "node": "node4", "action": "cordon", "why": "x"})
    assert "the most one user may" in said["error"]
    # An uncordon of a node the writer holds events of makes no new one: never refused.
    assert cordon.main({"share": share, "node": "node1", "action": "uncordon"})["lifted"]


def test_text_from_the_record_reaches_a_terminal_with_its_escapes_visible(share: str) -> None:
    """bob's reason that would erase its own line and print "no node is cordoned", and a
    file whose name carries escapes: shown escaped, the latter refused."""
    cordon.record(share, "node1", cordon.CORDON, "\x1b[1A\x1b[2K\rno node is cordoned",
                  run="r\x1b[31m1")
    where = Path(cordon.cordons_dir(share))
    (where / "n\x1b[2K@100000000000@bob.json").write_text(
        json.dumps({"node": "n\x1b[2K", "action": "cordon", "why": "x"}))
    listed = cordon.main({"share": share})
    got = listed["cordoned"]["node1"]
    assert (got["why"], got["run"]) == ("\\x1b[1A\\x1b[2K\\x0dno node is cordoned",
                                        "r\\x1b[31m1"), got
    assert list(listed["cordoned"]) == ["node1"]
    assert [(i["file"], i["why"]) for i in listed["ignored"]] == [
        ("n\\x1b[2K@100000000000@bob.json", "its file name names no node")]
    cordon.record(share, "node1", cordon.CORDON, "x\x07", now=time.time() + 1)
    assert (cordon.current(share, "node1") or {})["why"] == "x\\x07"
