"""How `ssh.connect` treats what OpenSSH says when a connection fails.

A stand-in `ssh` executable (a test double: a shell script that prints what OpenSSH prints
and exits 255) plays the server that drops connections, so that every message OpenSSH
is known to give can be shown quickly here. The real drops, from a bastion's sshd at its
default MaxStartups, are in tests/orchestrator/run/test_real_site_sandbox.py.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cluster import ssh
from orchestrator.errors import InventoryError, PreflightError

# OpenSSH 9's words: the server dropping the connection itself, and a bastion on the way
# (ProxyJump) dropping the jump.
SERVER_DROP = "kex_exchange_identification: read: Connection reset by peer"
BASTION_DROP = "banner exchange: Connection to UNKNOWN port 65535: Broken pipe"
REFUSED = "alice@node0: Permission denied (publickey)."


def stand_in_ssh(tmp_path: Path, stderr: str, failures: int,
                 proxy_said: str | None = None) -> tuple[ssh.SshTarget, Path]:
    """An `ssh` that fails its first FAILURES master connections with STDERR, then
    connects; every master connection is counted in the returned file. A connection
    without a master (ssh's diagnosis of a failed one) says PROXY_SAID, else STDERR."""
    calls = tmp_path / "calls"
    script = tmp_path / "ssh"
    (tmp_path / "said").write_text(stderr + "\n")
    (tmp_path / "proxy-said").write_text((proxy_said or stderr) + "\n")
    script.write_text(f"""#!/bin/sh
case " $* " in *" -O "*) exit 0;; esac
case " $* " in *" ControlPath=none "*) cat {tmp_path}/proxy-said >&2; exit 255;; esac
echo x >> {calls}
if [ "$(wc -l < {calls})" -le {failures} ]; then cat {tmp_path}/said >&2; exit 255; fi
exit 0
""")
    script.chmod(0o755)
    return ssh.SshTarget(host="node0", user="alice", ssh_executable=str(script)), calls


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssh.time, "sleep", lambda _s: None)


@pytest.mark.parametrize("said", [SERVER_DROP, BASTION_DROP])
def test_a_dropped_connection_is_tried_again(tmp_path: Path, said: str) -> None:
    target, calls = stand_in_ssh(tmp_path, said, failures=ssh.DROPPED_RETRIES)
    conn = ssh.connect("node0", target)
    conn.close()
    assert len(calls.read_text().splitlines()) == ssh.DROPPED_RETRIES + 1


@pytest.mark.parametrize("said", [SERVER_DROP, BASTION_DROP])
def test_dropped_every_time_names_maxstartups(tmp_path: Path, said: str) -> None:
    target, calls = stand_in_ssh(tmp_path, said, failures=99)
    with pytest.raises(PreflightError) as err:
        ssh.connect("node0", target)
    assert "MaxStartups" in str(err.value) and said in str(err.value)
    assert len(calls.read_text().splitlines()) == ssh.DROPPED_RETRIES + 1


def test_a_key_the_bastion_refused_is_named_not_taken_for_a_drop(tmp_path: Path) -> None:
    """Through a ProxyJump, a master with ControlPersist hides what the jump said (OpenSSH
    sends it to /dev/null): the refusal looks like a dropped connection. One connection
    without a master tells them apart, and a refusal is not tried again."""
    said = ("no such identity: /home/me/.ssh/gone: No such file or directory\n"
            "alice@10.0.0.1: Permission denied (publickey).\n" + BASTION_DROP)
    target, calls = stand_in_ssh(tmp_path, BASTION_DROP, failures=99, proxy_said=said)
    with pytest.raises(PreflightError) as err:
        ssh.connect("node0", target)
    assert "the private key /home/me/.ssh/gone does not exist" in str(err.value)
    assert "refused by alice@10.0.0.1" in str(err.value) and "MaxStartups" not in str(err.value)
    assert len(calls.read_text().splitlines()) == 1


# OpenSSH's words through a jump host that cannot reach the node (down, cut off).
UNREACHED = ("channel 0: open failed: connect failed: No route to host\n"
             "stdio forwarding failed\n"
             "kex_exchange_identification: Connection closed by remote host\n"
             "Connection closed by UNKNOWN port 65535")


def test_a_node_the_jump_host_cannot_reach_is_named_down_not_taken_for_a_drop(
        tmp_path: Path) -> None:
    """Behind a bastion, a node that is down ends the connection as a drop does; what the
    jump said (asked again without a master) tells them apart: not tried again, and not
    blamed on MaxStartups (a soak's run whose spare was powered off was)."""
    target, calls = stand_in_ssh(tmp_path, BASTION_DROP, failures=99, proxy_said=UNREACHED)
    with pytest.raises(PreflightError) as err:
        ssh.connect("node0", target)
    assert "cannot reach it (No route to host): is the node up" in str(err.value)
    assert "MaxStartups" not in str(err.value)
    assert len(calls.read_text().splitlines()) == 1


@pytest.mark.parametrize("mode", ["0644", "0640"])
def test_a_private_key_others_can_read_is_named_with_the_fix(tmp_path: Path, mode) -> None:
    said = (f"Permissions {mode} for '/home/me/.ssh/id' are too open.\n"
            'Load key "/home/me/.ssh/id": bad permissions\n' + REFUSED)
    target, calls = stand_in_ssh(tmp_path, said, failures=99)
    with pytest.raises(PreflightError) as err:
        ssh.connect("node0", target)
    assert f"has mode {mode}" in str(err.value) and "chmod 600 /home/me/.ssh/id" in str(err.value)
    assert len(calls.read_text().splitlines()) == 1


def test_a_refused_login_is_reported_at_once(tmp_path: Path) -> None:
    target, calls = stand_in_ssh(tmp_path, REFUSED, failures=99)
    with pytest.raises(PreflightError, match="refused .*ansible_user and the key"):
        ssh.connect("node0", target)
    assert len(calls.read_text().splitlines()) == 1


def test_a_borrowed_connection_leaves_its_master_to_its_owner() -> None:
    """A queued run's check uses the allocation's connection to the first node: closing the
    check's (borrowed) copy leaves the master open, under the allocation that still runs
    over it; the owner's close ends it."""
    owner = ssh.Connection("node0", ssh.SshTarget("192.0.2.1"))
    Path(owner.control_path).touch()       # where the master's socket would be
    owner.borrowed().close()
    assert Path(owner.control_path).exists()
    owner.close()
    assert not Path(owner.control_path).exists()


def test_a_host_that_ssh_would_read_as_an_option_never_reaches_ssh(tmp_path: Path) -> None:
    """Whatever built it, a target whose host starts with '-' is refused before any ssh
    runs: OpenSSH would take `-oProxyCommand=...` for an option and run the command here."""
    pwned = tmp_path / "pwned"
    with pytest.raises(InventoryError, match=r"SSH host '-oProxyCommand=touch .*' would be "
                       r"read by ssh as an option.*host name or an IP address"):
        target = ssh.SshTarget(host=f"-oProxyCommand=touch {pwned}", timeout=3)
        ssh.connect("node0", target, within=10).close()
    assert not pwned.exists()


def test_every_ssh_command_line_ends_its_options_before_the_host(tmp_path: Path) -> None:
    """Every ssh this module starts (the master, its check and exit, a command, the
    diagnosis of a failed master, a tunnel, `ssh -G`) says `--` before the host: nothing
    after it is read as an option."""
    said = tmp_path / "argv"
    script = tmp_path / "ssh"
    script.write_text(f"""#!/bin/sh
printf '%s\\n' "$@" >> {said}; echo === >> {said}
case " $* " in *" ControlMaster=yes "*)
  if [ ! -e {tmp_path}/dropped ]; then
    touch {tmp_path}/dropped; echo "{SERVER_DROP}" >&2; exit 255
  fi;;
esac
case " $* " in *" -G "*) echo "hostname node0.example.org";; esac
exit 0
""")
    script.chmod(0o755)
    target = ssh.SshTarget(host="node0.example.org", user="alice", ssh_executable=str(script))
    conn = ssh.connect("node0", target)
    Path(conn.control_path).touch()   # where the master's socket would be
    assert conn.run("true").exit_code == 0 and conn.master_pid is None
    ssh.forward(target, 40001, 40002).wait()
    assert target.effective()["hostname"] == "node0.example.org"
    conn.close()
    calls = [c.strip("\n").split("\n") for c in said.read_text().split("===\n") if c.strip()]
    assert len(calls) == 8   # master twice, diagnosis, command, check, tunnel, -G, exit
    for argv in calls:
        assert argv[argv.index("--") + 1] == "node0.example.org", argv
    assert calls[3][-3:] == ["--", "node0.example.org", "true"]
