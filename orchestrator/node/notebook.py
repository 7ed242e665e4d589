"""JupyterLab for `clustertrain notebook`, as torchrun starts it on the node:
`node.py worker -m orchestrator.node.notebook [--idle S]` (workloads/notebook.py makes the run).

The port and the token are chosen here, on the node, where the server binds: a port free
on the loopback interface, a token from `secrets`. Both go to the job's own directory
(JOB/notebook.json, mode 0600 under the user's private ~/.clustertrain), where the
controller reads them over SSH to open its tunnel; nothing else keeps the token: not a
command line (the arguments below are given to JupyterLab inside this process, which
/proc/PID/cmdline does not show), not the run's record, not the environment.

JupyterLab then runs in this process: on 127.0.0.1 only (the tunnel is the one way in),
its root the user's home (notebooks outlive the run's job directory), its kernels in this
Python, the run's environment. With --idle S (a detached notebook) the server ends itself
after S seconds without a request, and idle kernels are culled after S seconds. JupyterLab
looks for inactivity once a minute, a period no option changes (so `--idle 10` would end
the server 60-120 s after its last request): a thread here asks the server to take the
same look (its own rule: no kernel, no terminal, no request for S seconds) every S/10
seconds, at most once a minute, and kernels and terminals are culled as often.

Standard library only, up to JupyterLab itself (which the environment provides).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import runpy
import secrets
import socket
import sys
import threading
import time

from .protocol import JOBS_SUBDIR, NODE_STATE_DIR, NOTEBOOK_FILE
from .util import write_atomically

LONGEST_LOOK = 60   # seconds: the longest period between looks for inactivity


def free_port() -> int:
    """A port free on this node's loopback now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def info_path(run_id: str) -> str:
    """JOB/notebook.json of run RUN_ID under this user's home."""
    return os.path.join(os.path.expanduser("~"), NODE_STATE_DIR, JOBS_SUBDIR, run_id,
                        NOTEBOOK_FILE)


def look_interval(idle: float) -> int:
    """Seconds between looks for inactivity for an --idle of IDLE seconds: a tenth of it,
    at least 1 and at most LONGEST_LOOK (the server ends at most a tenth late)."""
    return int(min(LONGEST_LOOK, max(1.0, idle / 10)))


def jupyter_argv(port: int, token: str, root: str, idle: float) -> list[str]:
    argv = ["jupyter-lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}"]
    if idle > 0:
        look = look_interval(idle)
        argv += [f"--ServerApp.shutdown_no_activity_timeout={int(idle)}",
                 f"--MappingKernelManager.cull_idle_timeout={int(idle)}",
                 f"--MappingKernelManager.cull_interval={look}",
                 f"--TerminalManager.cull_inactive_timeout={int(idle)}",
                 f"--TerminalManager.cull_interval={look}"]
    return argv


def look_for_inactivity(every: float) -> None:
    """Forever, every EVERY seconds: once JupyterLab's server is up, ask it (on its own
    event loop) to end if it has been inactive for its shutdown_no_activity_timeout. (The
    server's module is taken once JupyterLab has imported it whole, never imported here.)"""
    while True:
        time.sleep(every)
        server_app = getattr(sys.modules.get("jupyter_server.serverapp"), "ServerApp", None)
        if server_app is None or not server_app.initialized():
            continue
        app = server_app.instance()
        loop = getattr(app, "io_loop", None)
        if loop is not None:
            loop.add_callback(app.shutdown_no_activity)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="orchestrator.node.notebook", allow_abbrev=False)
    p.add_argument("--idle", type=float, default=0.0,
                   help="end after this many seconds without a request (0: never)")
    args = p.parse_args(argv)
    run_id = os.environ.get("CLUSTERTRAIN_RUN_ID")
    if not run_id:
        sys.exit("orchestrator.node.notebook: CLUSTERTRAIN_RUN_ID is not set; it starts "
                 "as a run of `clustertrain notebook`")
    if importlib.util.find_spec("jupyterlab") is None:
        sys.exit(f"orchestrator.node.notebook: this environment ({sys.prefix}) has no "
                 "jupyterlab: add jupyterlab to its environment file and make it again "
                 "(`env create`), or leave out --python-env to use the cluster's")
    home = os.path.expanduser("~")
    port, token = free_port(), secrets.token_urlsafe(32)
    write_atomically(info_path(run_id), json.dumps(
        {"port": port, "token": token, "pid": os.getpid()}).encode())
    print(f"[clustertrain] JupyterLab starting on 127.0.0.1:{port} (root {home})",
          flush=True)
    sys.argv = jupyter_argv(port, token, home, args.idle)
    if args.idle > 0:
        threading.Thread(target=look_for_inactivity, args=(look_interval(args.idle),),
                         name="idle-look", daemon=True).start()
    runpy.run_module("jupyterlab", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
