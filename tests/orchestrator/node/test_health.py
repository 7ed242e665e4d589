"""The node's health check (roles/health's files/health.py, the module orchestrator.node.health):
each check's verdict, and what one run does with it: the cordon in the share's record, its
lift, the history on the share, the lines kept on the node while the share cannot take
them. The share here is a directory (tmp_path) made as the nfs_server role makes it; the
timer and a stalled share are tested on the sandbox (tests/roles/test_health_sandbox.py).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import stat
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from orchestrator.node import cordon, health
from orchestrator.node.health import Config, ConfigError, Failure

from .test_cordon import DAEMON, FILES, NODE_PYTHON, as_root

NODE = "hpc-b"


@pytest.fixture
def share(tmp_path: Path) -> Path:
    root = tmp_path / "share"
    (root / cordon.CORDONS_SUBDIR).mkdir(parents=True)
    (root / health.HISTORY_SUBDIR).mkdir()
    return root


def config(share: Path, **kw) -> Config:
    return Config(node=NODE, share=str(share), share_timeout=5.0, **kw)


def held(share: Path) -> list[cordon.Event]:
    state = cordon.decide(cordon.read(str(share), NODE)[0], cordon.Admins(None)).get(NODE)
    return state.held if state else []


def lines(share: Path) -> list[dict]:
    path = Path(health.history_path(str(share), NODE))
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


SHARE_STALLED = Failure("share", "the share /mnt/cluster did not answer within 10 s")


# -- what one run does with its verdict -------------------------------------------------------

def stand_in_reboot(tmp_path: Path) -> tuple[tuple[str, ...], Path]:
    """A TEST DOUBLE of `systemctl reboot` (a test cannot reboot the machine it runs on):
    a command that notes that it ran."""
    said = tmp_path / "rebooted"
    return (sys.executable, "-c", f"open({str(said)!r}, 'a').write('reboot\\n')"), said


def stand_in_supervisor(tmp_path: Path, run: str, proven: bool = True) -> subprocess.Popen:
    """A process with a supervisor's command line (node.py supervise --job JOB --run RUN
    -- torchrun); with PROVEN, JOB/supervisor.pid holds its pid, as the launch writes it."""
    job = tmp_path / "jobs" / run
    job.mkdir(parents=True)
    node_py = tmp_path / "node.py"
    node_py.write_text("import time\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, str(node_py), "supervise", "--job", str(job),
                             "--run", run, "--", "torchrun"])
    if proven:
        (job / health.SUPERVISOR_PID).write_text(f"{proc.pid}\n")
    # Popen returns once the exec began; /proc/PID/cmdline reads empty until the kernel
    # has set the new program's arguments up (a window of microseconds, longer on a
    # loaded host), and a process without a command line is nobody's run.
    deadline = time.monotonic() + 30
    while not Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc


def test_a_process_only_named_like_a_supervisor_holds_no_reboot(tmp_path, monkeypatch) -> None:
    """bob's look-alike (his process says `node.py supervise --run ...`) without the job
    directory's word for it, or with a job directory whose supervisor.pid is another pid,
    another user's file or a link to the real one: nothing runs, as far as a reboot goes."""
    ours: set[str] = set()
    real = health._process_says
    monkeypatch.setattr(health, "_process_says",
                        lambda pid: real(pid) if pid in ours else ([], []))
    cfg = config(tmp_path)
    fakes = [stand_in_supervisor(tmp_path / str(i), f"r-bob{i}", proven=False)
             for i in range(4)]
    jobs = [tmp_path / str(i) / "jobs" / f"r-bob{i}" for i in range(4)]
    real_one = stand_in_supervisor(tmp_path / "real", "r-alice")
    try:
        ours.update(str(p.pid) for p in fakes)
        (jobs[1] / health.SUPERVISOR_PID).write_text(f"{real_one.pid}\n")  # not its pid
        (jobs[2] / health.SUPERVISOR_PID).write_text(f"{fakes[2].pid}\n")
        os.chown(jobs[2] / health.SUPERVISOR_PID, 1, 1)   # not its owner's file
        (jobs[3] / health.SUPERVISOR_PID).symlink_to(tmp_path / "real" / "jobs" / "r-alice"
                                                     / health.SUPERVISOR_PID)
        assert health.still_running(cfg) == []
        ours.add(str(real_one.pid))
        assert health.still_running(cfg) == [f"run r-alice of {cordon.user_name(os.getuid())}"]
    finally:
        for p in [*fakes, real_one]:
            p.kill()
            p.wait()


def test_the_health_checks_drains_name_no_user_and_its_supervisor_file_is_the_launchs() -> None:
    """No user's drain helper takes the check's drains for his own: its name is one useradd
    refuses (Debian's NAME_REGEX), and nobody has it here."""
    from orchestrator.node import protocol

    assert not re.fullmatch(r"[a-z_][-a-z0-9_]*\$?", health.DRAIN_WHO)
    assert health.DRAIN_WHO not in {p.pw_name for p in pwd.getpwall()}
    assert health.SUPERVISOR_PID == protocol.SUPERVISOR_PID


def test_a_reboot_waits_for_the_run_on_the_node_then_the_node_returns(
        share, tmp_path, monkeypatch) -> None:
    """A reboot asked while a run's supervisor lives on the node: cordoned at once, not
    rebooted while the run goes on; rebooted by the first check after it ended; the first
    check after the reboot lifts the cordon. The node's processes are this test's (other
    tests on this machine start stand-in supervisors of their own)."""
    ours: set[str] = set()
    real = health._process_says
    monkeypatch.setattr(health, "_process_says",
                        lambda pid: real(pid) if pid in ours else ([], []))
    reboot, rebooted = stand_in_reboot(tmp_path)
    cfg = config(share, reboot=reboot)
    state_dir = str(tmp_path / "state")
    run = stand_in_supervisor(tmp_path, "r-alice")
    ours.add(str(run.pid))
    try:
        health.ask_reboot(state_dir, "the NVIDIA driver 999.1 is installed", 1000.0)
        assert f"run r-alice of {cordon.user_name(os.getuid())}" in health.still_running(cfg)
        first = health.step(cfg, state_dir, now=1000.0, failures=[])
        assert [f["check"] for f in first.failing] == ["maintenance"] and first.cordoned
        [c] = held(share)
        assert c.why.startswith(health.WHY + "the NVIDIA driver 999.1 is installed: it "
                                "reboots once nothing runs on it")
        health.step(cfg, state_dir, now=1300.0, failures=[])
        assert not rebooted.exists()
    finally:
        run.kill()
        run.wait()
    health.step(cfg, state_dir, now=1600.0, failures=[])
    assert rebooted.read_text() == "reboot\n"
    assert [x["event"] for x in lines(share)] == ["failing", "rebooting"]
    assert held(share), "cordoned until the node is back"
    # The reboot (its test double ran above): the node comes back with a new boot id.
    pending = Path(state_dir) / health.REBOOT_PENDING
    pending.write_text(json.dumps({**json.loads(pending.read_text()), "boot": "before"}))
    back = health.step(cfg, state_dir, now=1900.0, failures=[])
    assert not back.failing and not back.cordoned and held(share) == []
    assert not pending.exists() and rebooted.read_text() == "reboot\n"
    assert [x["event"] for x in lines(share)] == ["failing", "rebooting", "passing"]


def test_slurm_jobs_on_the_node_hold_its_reboot_and_an_unreadable_queue_too(tmp_path) -> None:
    """squeue here is a TEST DOUBLE (Slurm's own runs on the sandbox:
    tests/roles/test_health_sandbox.py)."""
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\necho \"$*\" > \"$0.args\"\necho '4711 alice'\n")
    squeue.chmod(0o755)
    cfg = Config(node=NODE, share=str(tmp_path), slurm=True, squeue=str(squeue))
    assert "Slurm job 4711 of alice" in health.still_running(cfg)
    assert (tmp_path / "squeue.args").read_text().split() == ["-h", "-w", NODE, "-o", "%i", "%u"]
    squeue.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact' >&2\nexit 1\n")
    assert "Slurm's jobs on it (squeue: slurm_load_jobs error: Unable to contact)" in \
        health.still_running(cfg)


def test_a_failing_node_is_cordoned_once_and_lifted_when_it_passes(share, tmp_path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    first = health.step(config(share), str(state_dir), now=1000.0, failures=[SHARE_STALLED])
    assert first.failing and first.cordoned and first.since == 1000.0
    [c] = held(share)
    assert c.why == health.WHY + SHARE_STALLED.why
    again = health.step(config(share), str(state_dir), now=1300.0, failures=[SHARE_STALLED])
    assert again.cordoned and again.since == 1000.0
    assert len(held(share)) == 1 and len(lines(share)) == 1   # no second cordon, no new line
    passed = health.step(config(share), str(state_dir), now=1600.0, failures=[])
    assert not passed.failing and not passed.cordoned
    assert held(share) == []
    assert [x["event"] for x in lines(share)] == ["failing", "passing"]
    assert lines(share)[0]["failures"][0]["why"] == SHARE_STALLED.why
    # the state every user's preflight reads
    kept = health.read_state(str(state_dir))
    assert kept is not None and kept["failing"] == [] and kept["node"] == NODE
    assert stat.S_IMODE(os.stat(state_dir / "state.json").st_mode) == 0o644


def test_the_check_lifts_no_cordon_but_its_own(share, tmp_path) -> None:
    """A run's cordon of the node stays when the health check passes again (here the
    writer may lift every cordon, as root may where the share does not squash root)."""
    cordon.record(str(share), NODE, cordon.CORDON, "a run lost it", run="r1")
    health.step(config(share), str(tmp_path), now=1.0, failures=[SHARE_STALLED])
    assert len(held(share)) == 2
    health.step(config(share), str(tmp_path), now=2.0, failures=[])
    assert [c.why for c in held(share)][0] == "a run lost it"


def test_lines_the_share_cannot_take_wait_on_the_node(share, tmp_path) -> None:
    missing = tmp_path / "not-yet"   # the share, away: every write to it fails
    cfg = config(missing)
    state = health.step(cfg, str(tmp_path), now=1.0, failures=[SHARE_STALLED])
    assert state.failing and not state.cordoned
    assert (tmp_path / "outbox.jsonl").read_text().count("\n") == 1
    health.step(cfg, str(tmp_path), now=2.0, failures=[])
    assert (tmp_path / "outbox.jsonl").read_text().count("\n") == 2
    share.rename(missing)            # the share answers again
    health.step(cfg, str(tmp_path), now=3.0, failures=[])
    assert not (tmp_path / "outbox.jsonl").exists()
    path = Path(health.history_path(str(missing), NODE))
    assert [json.loads(x)["event"] for x in path.read_text().splitlines()] == \
        ["failing", "passing"]
    assert held(missing) == []       # never written: nothing to lift


def test_a_broken_gpu_stays_cordoned_until_an_admin_lifts_it(share, tmp_path) -> None:
    xid = health.xid_failures("NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off "
                              "the bus.")
    health.step(config(share), str(tmp_path), now=1.0, failures=xid)
    still = health.step(config(share), str(tmp_path), now=2.0, failures=[])
    assert still.failing and still.cordoned   # the kernel said it once; the GPU is still gone
    cordon.record(str(share), NODE, cordon.UNCORDON, "GPU replaced")   # an admin (root here)
    back = health.step(config(share), str(tmp_path), now=3.0, failures=[])
    assert not back.failing


@as_root
def test_an_admins_uncordon_lifts_a_broken_gpus_hold(open_share: str, tmp_path) -> None:
    """An admin who is not root (a member of the inventory's admin group: here daemon, in
    group daemon) lifts the check's cordon of a broken GPU: the next check passes."""
    share = Path(open_share)
    (share / health.HISTORY_SUBDIR).mkdir()
    cfg = config(share, admin_group=grp.getgrgid(pwd.getpwuid(DAEMON).pw_gid).gr_name)
    xid = health.xid_failures("NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off "
                              "the bus.")
    health.step(cfg, str(tmp_path), now=1.0, failures=xid)
    subprocess.run([NODE_PYTHON, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                    "import cordon; cordon.record(sys.argv[2], sys.argv[3], 'uncordon', 'new GPU')",
                    str(FILES), open_share, NODE], user=DAEMON, check=True, timeout=60)
    back = health.step(cfg, str(tmp_path), now=2.0, failures=[])
    assert not back.failing and not back.cordoned, back


# -- each check ---------------------------------------------------------------------------

def test_space_below_the_limits_fails_naming_the_place() -> None:
    gib = 2**30
    figures = {"/": {"free": 1 * gib, "total": 100 * gib, "ifree": 10**6, "itotal": 10**6},
               "/tmp": {"free": 50 * gib, "total": 100 * gib, "ifree": 10, "itotal": 10**6},
               "/home": {"free": 50 * gib, "total": 100 * gib, "ifree": 10**6, "itotal": 10**6}}
    failed = health.check_space(figures, min_free_gb=2.0, min_free_inodes=1000)
    assert [f.why.split(" ")[0] for f in failed] == ["/", "/tmp"]
    assert "1.00 GiB free" in failed[0].why and "cluster_min_free_gb" in failed[0].why
    assert "10 inodes free" in failed[1].why


def test_the_share_is_measured_and_must_be_a_mount(tmp_path) -> None:
    failed, figures = health.check_share(Config(node=NODE, share="/", share_timeout=10))
    assert failed == [] and figures and figures["total"] > 0
    failed, _ = health.check_share(Config(node=NODE, share=str(tmp_path), share_timeout=10))
    assert [f.check for f in failed] == ["share"] and "not mounted" in failed[0].why
    failed, _ = health.check_share(Config(node=NODE, share=str(tmp_path / "x"),
                                          share_timeout=10))
    assert "cannot be read" in failed[0].why


@as_root
def test_who_fills_a_nearly_full_share_is_counted_on_its_server_and_gone_with_room(
        tmp_path) -> None:
    """The export walked by root (a child of the check, as the timer runs it): each owner's
    bytes, the biggest first, a hard link once; counted again only after USERS_EVERY; the
    file removed once the share has room."""
    export = tmp_path / "export"
    (export / health.HISTORY_SUBDIR).mkdir(parents=True)
    (export / "checkpoints" / "daemon").mkdir(parents=True)
    ckpt = export / "checkpoints" / "daemon" / "step9.pt"
    ckpt.write_bytes(os.urandom(3 << 20))
    os.link(ckpt, export / "checkpoints" / "daemon" / "last.pt")
    os.chown(ckpt, DAEMON, DAEMON)
    (export / "data.bin").write_bytes(os.urandom(1 << 20))   # root's
    cfg = Config(node=NODE, share="/mnt/cluster", export=str(export), min_free_gb=1e9)
    health.share_users(cfg, now=1000.0)   # below a billion GiB free: nearly full
    counted = health.read_users(str(export))
    assert counted is not None, list((export / health.HISTORY_SUBDIR).iterdir())
    assert list(counted["users"]) == ["daemon", "root"], counted
    assert counted["users"]["daemon"] == 3 << 20          # its two names, once
    assert 1 << 20 <= counted["users"]["root"] < 2 << 20  # the file, the directories
    assert counted["time"] == 1000.0 and counted["unread"] == 0
    assert os.stat(health.users_path(str(export))).st_mode & 0o777 == 0o644
    (export / "data.bin").unlink()
    health.share_users(cfg, now=1000.0 + health.USERS_EVERY - 1)
    assert (health.read_users(str(export)) or {}).get("time") == 1000.0   # not walked yet
    health.share_users(cfg, now=1000.0 + health.USERS_EVERY)
    again = health.read_users(str(export)) or {}
    assert again["time"] > 1000.0 and again["users"].get("root", 0) < 1 << 20, again
    roomy = {"free": 50 << 30, "total": 100 << 30, "ifree": 10**6, "itotal": 10**6}
    assert health.count_users(str(export), roomy, 2.0, 9999.0) is False
    assert health.read_users(str(export)) is None


def test_nearly_full_is_below_the_minimum_or_a_twentieth() -> None:
    gib = 2**30
    room = {"free": 50 * gib, "total": 100 * gib, "ifree": 10**6, "itotal": 10**6}
    assert not health.nearly_full(room, 2.0)
    assert health.nearly_full({**room, "free": 1 * gib}, 2.0)
    assert health.nearly_full({**room, "free": 4 * gib}, 2.0)        # under 5 %
    assert health.nearly_full({**room, "ifree": 10**4}, 2.0)         # inodes under 5 %
    assert not health.nearly_full({"error": "Stale file handle"}, 2.0)


# nvidia-smi's answer to SMI_FIELDS, written by hand in its CSV format (a test double:
# no GPU here): GPU 1 with 2 uncorrected ECC errors and a row remap pending; an older GPU
# without row remapping ("[N/A]") and a retired page pending.
SMI = ("0, 0, No, No, No\n"
       "1, 2, No, Yes, No\n"
       "2, [N/A], Yes, [N/A], [N/A]\n")


def test_gpu_errors_nvidia_smi_reports_fail() -> None:
    failed = health.gpu_failures(SMI)
    assert [f.why.split(":")[0] for f in failed] == ["GPU 1", "GPU 2"]
    assert "2 uncorrected ECC" in failed[0].why and "row remap pending" in failed[0].why
    assert "retired page pending" in failed[1].why


def test_nvidia_smi_failing_fails_and_missing_skips(tmp_path) -> None:
    smi = tmp_path / "nvidia-smi"   # a test double of a GPU fallen off the bus
    smi.write_text("#!/bin/sh\necho 'Unable to determine the device handle for GPU "
                   "0000:3B:00.0: GPU is lost.' >&2\nexit 15\n")
    smi.chmod(0o755)
    [failed] = health.check_gpus(str(smi))
    assert "GPU is lost" in failed.why
    assert health.check_gpus(str(tmp_path / "absent")) == []


def test_only_xids_of_a_broken_gpu_fail() -> None:
    log = ("NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, Graphics Exception\n"
           "NVRM: Xid (PCI:0000:5e:00): 48, pid=4242, DBE (double bit error)\n"
           "NVRM: Xid (PCI:0000:5e:00): 48, pid=4242, DBE (double bit error)\n")
    [failed] = health.xid_failures(log)
    assert failed.sticky and "0000:5e:00: Xid 48 (double-bit ECC error)" in failed.why


def test_the_clock_fails_only_when_synchronised_and_far_off() -> None:
    tracking = ("Reference ID    : C0A80001 (192.168.0.1)\n"
                "System time     : 2.500000000 seconds slow of NTP time\n"
                "Leap status     : Normal\n")
    [failed] = health.clock_failures(tracking, max_offset=1.0)
    assert "2.500000000 s slow" in failed.why
    assert health.clock_failures(tracking, max_offset=5.0) == []
    assert health.clock_failures(tracking.replace("Normal", "Not synchronised"), 1.0) == []


def test_uncorrected_memory_errors_fail(tmp_path) -> None:
    for mc, ue in (("mc0", "0"), ("mc1", "3")):
        (tmp_path / mc).mkdir()
        (tmp_path / mc / "ue_count").write_text(ue + "\n")
    [failed] = health.check_memory(str(tmp_path))
    assert failed.check == "memory" and "3 uncorrected memory error(s) on mc1" in failed.why
    assert health.check_memory(str(tmp_path / "none")) == []


# -- its settings and what `nodes` reads --------------------------------------------------

@pytest.mark.parametrize("data, said", [
    ({"share": "/mnt/cluster"}, "'node' must be a non-empty string"),
    ({"node": "a b", "share": "/mnt/cluster"}, "is not a node name"),
    ({"node": NODE, "share": "/s", "share_timeout": "10"}, "share_timeout '10'"),
    ({"node": NODE, "share": "/s", "color": 1}, "unknown keys ['color']"),
    ({"node": NODE, "share": "/s", "slurm": "yes"}, "slurm 'yes': give true or false"),
    ({"node": NODE, "share": "/s", "nvidia_smi": ""}, "nvidia_smi '': give a command"),
    ({"node": NODE, "share": "/s", "journalctl": 0}, "journalctl 0: give a command"),
    ({"node": NODE, "share": "/s", "admin_group": 7}, "admin_group 7: give a group name"),
    ({"node": NODE, "share": "/s", "export": "srv"}, "export 'srv': give the export's "
                                                     "absolute path"),
    ({"node": NODE, "share": "/s", "places": ["tmp"]}, "places ['tmp']: give a list of "
                                                        "absolute paths"),
    ({"node": NODE, "share": "/s", "reboot": "systemctl reboot"}, "reboot 'systemctl reboot': "
                                                                   "give a command as a list"),
])
def test_bad_settings_are_named(tmp_path, data, said) -> None:
    path = tmp_path / "health.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=None) as err:
        Config.load(str(path))
    assert said in str(err.value)


def test_history_reads_every_nodes_lines_since(share) -> None:
    where = share / health.HISTORY_SUBDIR
    (where / "hpc-a.jsonl").write_text(json.dumps({"time": 10, "event": "failing"}) + "\n"
                                       + json.dumps({"time": 20, "event": "passing"}) + "\n")
    (where / "bad name.jsonl").write_text(json.dumps({"time": 30}) + "\n")
    assert health.history(str(share), since=15) == {"hpc-a": [{"time": 20,
                                                               "event": "passing"}]}


# -- a local disk that a user's temporary files fill -------------------------------------------

MIB = 2**20


def test_a_disk_that_a_users_temporary_files_fill_is_a_warning_naming_them(tmp_path) -> None:
    """bob (here: bin) fills the node's /tmp: the node is not broken, so the check warns,
    naming him, and cordons nothing; where users' files hold less than is missing, the
    failure stands (and names them too). Root's own files are nobody's to blame."""
    temp = tmp_path / "tmp"
    (temp / "bobs").mkdir(parents=True)
    big = temp / "bobs" / "fill"
    big.write_bytes(os.urandom(3 * MIB))
    os.chown(big, 1, 1)
    (temp / "roots").write_bytes(os.urandom(5 * MIB))
    dev = os.stat(temp).st_dev
    deadline = time.monotonic() + 30
    assert health.temp_users(dev, deadline, (str(temp),)) == {
        cordon.user_name(1): os.stat(big).st_blocks * 512}
    short = Failure("space", "/tmp has 0.00 GiB free of 10.0, below ...")
    got = {"free": 0, "total": 10 * 2**30, "dev": dev}
    warned = health.blamed(short, "/tmp", got, 2 / 1024, deadline, (str(temp),))
    assert warned.warning and warned.check == "space", warned
    assert f"filled by temporary files ({temp}) of {cordon.user_name(1)} 0.00 GiB" \
        in warned.why and "not cordoned" in warned.why
    kept = health.blamed(short, "/tmp", got, 4 / 1024, deadline, (str(temp),))
    assert not kept.warning and kept.why.startswith(short.why) and \
        f"biggest users: {cordon.user_name(1)}" in kept.why
    assert health.blamed(short, "/tmp", got, 2 / 1024, time.monotonic() - 1,
                         (str(temp),)) == short   # not counted in time: as it was


def test_a_warning_is_kept_and_said_but_never_cordoned_for(share, tmp_path) -> None:
    cfg = config(share)
    state_dir = str(tmp_path / "state")
    os.mkdir(state_dir)   # the unit's StateDirectory
    filled = Failure("space", "/tmp ... filled by temporary files of bob", warning=True)
    state = health.step(cfg, state_dir, now=1000.0, failures=[filled])
    assert not state.failing and not state.cordoned and held(share) == []
    assert state.warnings == [asdict(filled)] and lines(share) == []
    assert (health.read_state(state_dir) or {})["warnings"] == [asdict(filled)]
    assert health.step(cfg, state_dir, now=1300.0, failures=[]).warnings == []
