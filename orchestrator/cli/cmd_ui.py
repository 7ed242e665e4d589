"""`ui`: a local web page over the runs directory (each run's report, live while it runs)
and, with -i, the cluster's nodes (orchestrator/ui/server.py)."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from ..errors import ClusterError
from . import values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ui", help="a web page of the runs (live) and the nodes, on this "
                       "machine",
                       description="Serve a web page over the runs directory: every run, "
                       "newest first, each with its report (charts, each node's log), which "
                       "reloads itself while the run runs; with -i, the inventory's nodes: "
                       "cordoned or not, which run holds each and, on Slurm, the queue. It "
                       "listens on 127.0.0.1 (every user of this machine reaches that "
                       "too), so on any --host every request must carry the token in the "
                       "URL it prints (a new one each start; the page keeps it in a "
                       "cookie): open that URL, and keep it to yourself. Ctrl-C stops it.")
    values.add_runs_dir(p)
    values.add_inventory(p, None, "the cluster's inventory, for the nodes page (without "
                         "it the page shows the runs only)")
    p.add_argument("--host", default="127.0.0.1", type=values.text("an address to listen on"),
                   help="the address to listen on (default 127.0.0.1: this machine only; "
                   "the token is asked on every address)")
    p.add_argument("--port", type=int, default=8470,
                   help="the port to listen on (default 8470; 0: any free one)")
    p.set_defaults(func=_ui)


def _ui(args: argparse.Namespace) -> int:
    from ..ui.server import UiServer, ask_cluster

    runs_dir = Path(args.runs_dir)
    if not 0 <= args.port <= 65535:
        raise ClusterError(f"--port {args.port}: not a port; give 1-65535, or 0 for any free one")
    cluster = None
    if args.inventory:
        from ..cluster.inventory import load_cluster
        load_cluster(args.inventory)   # a wrong inventory is said now, not on the page
        cluster = functools.partial(ask_cluster, args.inventory)
    server = UiServer(runs_dir, host=args.host, port=args.port, cluster=cluster)
    print(f"clustertrain ui: {server.url}", flush=True)
    who = ("the other users of this machine reach it too" if server.loopback else
           "anyone who can reach it")
    print(f"note: listening on {args.host}: {who}; the token in that URL keeps them out of "
          "your runs: keep it to yourself", flush=True)
    print("Ctrl-C stops it", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.httpd.server_close()
    return 0
