"""JupyterLab for `clustertrain notebook`, as torchrun starts it on the node:
`node.py worker -m orchestrator.node.notebook [--idle S]` (workloads/notebook_run.py makes the run).

The port and the first token are chosen here, on the node, where the server binds: a port
free on the loopback interface, a token from `secrets`. Both go to the job's own directory
(JOB/notebook.json, mode 0600 under the user's private ~/.clustertrain), where the
controller reads the port over SSH to open its tunnel; nothing else keeps the token: not a
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

The token that opens the server is short-lived: the controller's `notebook` (or `notebook
connect`) writes a fresh one of its own to JOB/notebook-access.json (0600) when it opens
its tunnel, touches the file every ~30 s while the tunnel is open and removes it when it
ends. A thread here (keep_token) makes the server's token the file's while the file is
fresh, and once it is gone, or not touched for STALE_AFTER seconds (the controller killed),
a random one nobody knows; each change also makes a new cookie secret, so that a login
cookie given before it opens nothing either. A printed URL, or a cookie of 127.0.0.1 that
a browser keeps, is worth nothing once its command has ended. The token JupyterLab starts
with (notebook.json's) is the access file's first, so it expires the same way. One file,
one token: a second `notebook connect` to the same notebook replaces the first one's token
(the last connect wins); a connection already open (a kernel's WebSocket) stays open.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .protocol import JOBS_SUBDIR, NODE_STATE_DIR, NOTEBOOK_FILE
from .util import write_atomically

LONGEST_LOOK = 60   # seconds: the longest period between looks for inactivity
ACCESS_FILE = "notebook-access.json"   # JOB/: the token that opens the server now
STALE_AFTER = 90.0  # seconds: an access file not touched for this long opens nothing
LOOK_FOR_ACCESS = 1.0   # seconds between looks at the access file


def free_port() -> int:
    """A port free on this node's loopback now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def info_path(run_id: str) -> str:
    """JOB/notebook.json of run RUN_ID under this user's home."""
    return os.path.join(os.path.expanduser("~"), NODE_STATE_DIR, JOBS_SUBDIR, run_id,
                        NOTEBOOK_FILE)


def access_path(run_id: str) -> str:
    """JOB/notebook-access.json of run RUN_ID under this user's home."""
    return os.path.join(os.path.dirname(info_path(run_id)), ACCESS_FILE)


@dataclass(frozen=True)
class Access:
    """The access file's token, and when it was last written or touched (this node's clock)."""
    token: str
    at: float


def read_access(path: str) -> Access | None:
    """The access file at PATH, None when there is none or it holds no usable token (a
    token shorter than 16 characters is none: an empty one would open the server to
    anyone)."""
    try:
        at = os.stat(path).st_mtime
        with open(path, encoding="utf-8") as fh:
            token = json.load(fh)["token"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(token, str) or len(token) < 16:
        return None
    return Access(token, at)


def wanted_token(access: Access | None, now: float) -> str | None:
    """The token that should open the server at NOW: ACCESS's while it was touched within
    STALE_AFTER seconds; None (no token anybody knows) otherwise."""
    if access is None or now - access.at > STALE_AFTER:
        return None
    return access.token


class TokenKeeper:
    """The server's token, as the access file wants it: step() says each change to make
    (a token to set, with a new cookie secret), None when nothing changes."""

    def __init__(self, token: str) -> None:
        self.token, self.closed = token, False

    def step(self, access: Access | None, now: float) -> str | None:
        """The token to give the server now, if it differs from the one it has: the
        access file's, or, once that is gone or stale, a random one (made once)."""
        want = wanted_token(access, now)
        if want is None:
            if self.closed:
                return None
            self.token, self.closed = secrets.token_urlsafe(32), True
            return self.token
        if want == self.token and not self.closed:
            return None
        self.token, self.closed = want, False
        return want


def set_token(app: Any, token: str) -> None:
    """On the server's event loop: TOKEN opens APP (a jupyter_server ServerApp) from now on,
    and a new cookie secret voids every login cookie given before (jupyter_server reads
    IdentityProvider.token, and tornado the settings' cookie_secret, at each request)."""
    app.identity_provider.token = token
    settings = app.web_app.settings
    if "token" in settings:   # the legacy login handlers' copy
        settings["token"] = token
    settings["cookie_secret"] = secrets.token_bytes(32)


def on_server(token: str) -> bool:
    """Ask JupyterLab's running server to take TOKEN (set_token, on its own event loop);
    False while there is no running server yet (the change is asked again later)."""
    server_app = getattr(sys.modules.get("jupyter_server.serverapp"), "ServerApp", None)
    if server_app is None or not server_app.initialized():
        return False
    app = server_app.instance()
    loop = getattr(app, "io_loop", None)
    if loop is None or getattr(app, "web_app", None) is None:
        return False
    loop.add_callback(set_token, app, token)
    return True


def keep_token(path: str, keeper: TokenKeeper, apply: Callable[[str], bool] = on_server,
               every: float = LOOK_FOR_ACCESS, clock: Callable[[], float] = time.time,
               stop: threading.Event | None = None) -> None:
    """Every EVERY seconds until STOP: the access file at PATH read, and the change KEEPER
    says given to the server with APPLY (asked again until APPLY takes it)."""
    stop = stop or threading.Event()
    pending: str | None = None
    while not stop.wait(every):
        change = keeper.step(read_access(path), clock())
        if change is not None:
            pending = change
        if pending is not None and apply(pending):
            pending = None


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
    write_atomically(access_path(run_id), json.dumps({"token": token}).encode())
    write_atomically(info_path(run_id), json.dumps(
        {"port": port, "token": token, "pid": os.getpid()}).encode())
    print(f"[clustertrain] JupyterLab starting on 127.0.0.1:{port} (root {home})",
          flush=True)
    sys.argv = jupyter_argv(port, token, home, args.idle)
    if args.idle > 0:
        threading.Thread(target=look_for_inactivity, args=(look_interval(args.idle),),
                         name="idle-look", daemon=True).start()
    threading.Thread(target=keep_token, args=(access_path(run_id), TokenKeeper(token)),
                     name="token-keeper", daemon=True).start()
    runpy.run_module("jupyterlab", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
