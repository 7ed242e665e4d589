"""The soak's nemesis: each fault of plan.FAULTS as the commands that inject it into a
sandbox's containers and the commands that heal it (Jepsen's nemesis: the history records
both, `fault` and `heal`).

- kill-node: the node's container stopped at once (a power cut), started again after
  `for_s` seconds (same address; its services start again as at a boot).
- fill-tmp: the node's /tmp full for `for_s` seconds, then freed. The sandbox's /tmp is a
  tmpfs as big as half the host's memory: it is first shrunk to what it holds plus
  FILL_ROOM (a remount keeps what is there), then filled, so that filling it costs
  FILL_ROOM of memory, not gigabytes; the heal frees the file and gives the size back.
- stall-share: every access to the share blocks on the node for `for_s` seconds, as on an
  NFS mount whose server stalls (`sandbox share-stall`, share.py: the node's FUSE daemon
  stopped).
- restart-slurmctld: Slurm's controller restarted on its node (the NFS server's, node0).
- kill-train-9: kill -9 of a running `train` (the controller) of the soak's; the executor
  chooses the process, the nemesis only says how it is killed.

gpu-xid and cut-node-off raise NotImplementedYet (the executor records them as `info`).
Standard library only: the commands are tested without a cluster.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .workload import NothingToAimAt, NotImplementedYet

FILL = "/tmp/soak-fill"
FILL_ROOM = 64 << 20          # bytes a full /tmp is left to fill
TMP_SIZE = "/run/soak-tmp-size"   # the node's /tmp size before the fault, for the heal
CONTROLLER = "node0"          # where site.yml runs slurmctld (roles/slurm: the NFS server)


@dataclass(frozen=True)
class Fault:
    """A fault as commands: INJECT (run in order), then HEAL after HOLD seconds (0: INJECT
    itself lasts the fault, or nothing heals it)."""
    kind: str
    node: str
    inject: tuple[tuple[str, ...], ...]
    heal: tuple[tuple[str, ...], ...] = ()
    hold: float = 0.0
    wait_ssh: bool = False      # after the heal: until the node answers SSH again


def fill_script(room: int = FILL_ROOM) -> str:
    """Shell (as root, with CAP_SYS_ADMIN: `podman exec --privileged`) that fills /tmp:
    its tmpfs shrunk to what it holds plus ROOM, then a file written until no space is
    left. The size before is kept in TMP_SIZE for the heal."""
    return ("set -eu; "
            f"df --output=size -B1 /tmp | tail -1 | tr -d ' ' > {TMP_SIZE}; "
            "used=$(df --output=used -B1 /tmp | tail -1 | tr -d ' '); "
            f"mount -o remount,size=$((used + {room})) /tmp; "
            f"dd if=/dev/zero of={FILL} bs=1M 2>/dev/null || true; "
            "df -h /tmp | tail -1")


def free_script() -> str:
    """Shell that undoes fill_script: the file removed, /tmp's size given back."""
    return (f"rm -f {FILL}; "
            f"[ -s {TMP_SIZE} ] && mount -o remount,size=$(cat {TMP_SIZE}) /tmp; "
            f"rm -f {TMP_SIZE}; df -h /tmp | tail -1")


def fault_for(kind: str, node: str, for_s: float, sandbox: str, containers: dict[str, str],
              pid: int | None = None) -> Fault:
    """The fault KIND on NODE for FOR_S seconds in the sandbox SANDBOX (CONTAINERS: node ->
    its podman container). PID: the `train` process kill-train-9 kills."""
    if kind == "kill-train-9":
        if pid is None:
            raise NothingToAimAt("kill-train-9: no `train` of the soak's was running")
        return Fault(kind, node, (("kill", "-9", str(pid)),))
    if kind not in ("kill-node", "fill-tmp", "stall-share", "restart-slurmctld"):
        raise NotImplementedYet(f"{kind}: not implemented by the soak's nemesis yet")
    container = containers[node]
    if kind == "kill-node":
        return Fault(kind, node, (("podman", "stop", "-t", "0", container),),
                     (("podman", "start", container),), hold=for_s, wait_ssh=True)
    if kind == "fill-tmp":
        return Fault(kind, node, (("podman", "exec", "--privileged", container, "sh", "-c",
                                   fill_script()),),
                     (("podman", "exec", "--privileged", container, "sh", "-c",
                       free_script()),), hold=for_s)
    if kind == "stall-share":
        return Fault(kind, node, ((sys.executable, "-m", "orchestrator", "sandbox",
                                   "share-stall", "--name", sandbox, "--seconds",
                                   f"{for_s:g}", "--nodes", node),))
    ctl = containers[CONTROLLER]   # restart-slurmctld
    return Fault(kind, CONTROLLER, (("podman", "exec", ctl, "systemctl", "restart",
                                     "slurmctld"),))
