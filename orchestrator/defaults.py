"""Every default of the orchestrator and the site values it assumes, in one place. The
node-side ones are the node package's (node/protocol.py: the supervisor runs with them),
and the doctor's measurements are its job's (node/doctor.py); they are named here too, so
that an option's default is found where the others are."""

from __future__ import annotations

from pathlib import Path

from . import contract as _contract
from .node import doctor as _doctor, health as _health, protocol as _node

# -- where things are --------------------------------------------------------------------
INVENTORY = Path("inventory/hosts.yml")   # -i/--inventory: the one site.yml uses
RUNS_DIR = Path("runs")                   # --runs-dir: the runs' records, on this machine
SCRIPT = "train.py"                       # train's script, relative to --workdir
# -- site values (the inventory may set them: cluster_shared_path, cluster_rendezvous_port,
# ansible_python_interpreter); the ones the roles share are read from roles/contract, where
# the roles read them --------------------------------------------------------------------
SHARED_PATH = str(_contract.role_default("contract", "cluster_shared_path"))
RENDEZVOUS_PORT = int(_contract.role_default("contract", "cluster_rendezvous_port"))
# ...and how many ports from it up a run's master port may be (the firewall opens them)
RENDEZVOUS_SPAN = int(_contract.role_default("contract", "cluster_rendezvous_port_span"))
SCHEDULER = str(_contract.role_default("contract", "cluster_scheduler"))  # none | slurm
RING_PORTS = str(_contract.role_default("contract", "cluster_ring_ports"))  # UDP LOW-HIGH
ADMIN_GROUP = str(_contract.role_default("contract", "cluster_admin_group"))  # lift any cordon
NODE_PYTHON = "/usr/bin/python3"          # a node's system python: runs the node package
# Free space where runs write (the share, each node's home and temporary directory): a run
# is refused below MIN_FREE_GB (the inventory's cluster_min_free_gb) or MIN_FREE_INODES,
# and warned below SPACE_WARN of the filesystem's space or inodes.
MIN_FREE_GB = float(_contract.role_default("contract", "cluster_min_free_gb"))
MIN_FREE_INODES = _health.Config.min_free_inodes
SPACE_WARN = _health.NEARLY_FULL
# -- a run's policies (train's options) ---------------------------------------------------
GRACE = _node.GRACE                       # --grace: SIGTERM, then SIGKILL after this long
LEASE_TIMEOUT = _node.LEASE_TIMEOUT       # --lease-timeout
KEEP_RUNS = _node.KEEP_RUNS               # --keep-runs
KEEP_ENVS = _node.KEEP_ENVS               # env create --keep
HANG_TIMEOUT = 1800.0                     # --hang-timeout (0: off)
GPU_IDLE = 180.0                          # --gpu-idle: a GPU idle this long is flagged (0: off)
ON_HANG = "stop"                          # --on-hang stop|wait
MAX_RESTARTS = 0                          # --max-restarts (torchrun's)
RDZV_BACKEND = "static"                   # --rdzv-backend static|c10d
# -- doctor's measurements ----------------------------------------------------------------
LINK_SECONDS = _doctor.LINK_SECONDS       # --link-seconds
COMPUTE_SECONDS = _doctor.COMPUTE_SECONDS # doctor's GFLOP/s measurement
ALLREDUCE_MB = _doctor.ALLREDUCE_MB       # --allreduce-mb
DOCTOR_HANG_TIMEOUT = 120.0               # doctor's own run is watched for hangs this long
