"""`ui`: a local web page over the runs directory and the cluster.

    /                  the runs, newest first (what `runs` prints), refreshed every 5 s
    /runs/RUN/         a run's page (page.py), refreshed while the run runs
    /runs/RUN/FILE     a file of the run's record (its nodes' logs, as text)
    /sweeps/SWEEP/     a sweep's page (sweep/report.py): its trials best first, its charts
    /nodes             the inventory's nodes: cordoned or not, which run holds each; on a
                       Slurm cluster, the queue

Only GET and HEAD. It listens on loopback unless told otherwise, and on every address,
loopback included, every request carries its token (`?token=`, then a cookie): made at
start and printed in the URL only, it keeps the other users of the machine (who reach its
loopback too) out of this user's runs. On loopback a request must also name the loopback
as its Host (a page of another site pointed here by DNS is refused). No file outside the
runs directory is ever served, whatever the path or a symlink in the record says. Asking
the cluster (SSH) is cached for a few seconds, and a node that does not answer is said on
the page, not a failed request.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import ipaddress
import mimetypes
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from ..errors import ClusterError
from ..record.listing import listed
from ..record.rundir import RUN_ID, RecordUnreadable, RunDir, list_runs
from ..record.summary import Summary
from ..report.page import TEMPLATES, render_run
from ..sweep.liveness import settle
from ..sweep.record import SWEEP_JSON, SweepRecord, SweepUnreadable, TrialState, open_sweep
from ..sweep.report import render_sweep

DEFAULT_PORT = 8470
REFRESH_S = 5       # a page that changes (the runs, a live run, the nodes) reloads so often
CACHE_S = 10.0      # the cluster's answer (and a live run's settling) is reused so long
COOKIE = "clustertrain_ui"   # and the token's hash: each server its own cookie
TEXT = {".log", ".txt", ".jsonl", ".out", ".err", ".tmp"}   # served as text/plain
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}

ClusterQuery = Callable[[], dict[str, Any]]


def is_loopback(host: str) -> bool:
    """Whether HOST (an address or a name) is this machine's loopback only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def ask_cluster(inventory: str | Path) -> dict[str, Any]:
    """The nodes page's view of the cluster: its nodes, the cordoned ones (from the
    share's record) and, on Slurm, the queue. What cannot be asked is said as an error
    beside what could."""
    from ..cluster.drain import cordons
    from ..cluster.inventory import load_cluster
    from ..cluster.slurm import render_queue, squeue

    cluster = load_cluster(inventory)
    view: dict[str, Any] = {"inventory": str(cluster.inventory), "nodes": cluster.names,
                            "scheduler": cluster.scheduler, "cordoned": {},
                            "cordon_error": None, "queue": None, "queue_error": None}
    try:
        view["cordoned"] = cordons(cluster)
    except Exception as exc:  # noqa: BLE001 - a node down: said on the page
        view["cordon_error"] = str(exc) or type(exc).__name__
    if cluster.scheduler == "slurm":
        try:
            view["queue"] = render_queue(squeue(cluster))
        except Exception as exc:  # noqa: BLE001 - said on the page
            view["queue_error"] = str(exc) or type(exc).__name__
    return view


class _Cached:
    """A value asked for at most once every CACHE_S seconds (by one thread at a time);
    an exception raised is kept and raised again the same way."""

    def __init__(self, ask: Callable[[], Any], seconds: float) -> None:
        self.ask, self.seconds = ask, seconds
        self.lock = threading.Lock()
        self.at: float | None = None
        self.value: Any = None
        self.error: BaseException | None = None

    def get(self) -> Any:
        with self.lock:
            if self.at is None or time.monotonic() - self.at >= self.seconds:
                try:
                    self.value, self.error = self.ask(), None
                except Exception as exc:  # noqa: BLE001 - kept for the page
                    self.value, self.error = None, exc
                self.at = time.monotonic()
            if self.error is not None:
                raise self.error
            return self.value


class UiServer:
    """The `ui` web server over RUNS_DIR. HOST/PORT: where it listens (port 0: a free
    one). CLUSTER: what /nodes shows (None: no inventory was given). TOKEN: what every
    request must carry, on any address; None (or '') makes one."""

    def __init__(self, runs_dir: Path, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 cluster: ClusterQuery | None = None, token: str | None = None,
                 cache_s: float = CACHE_S) -> None:
        if runs_dir.exists() and not runs_dir.is_dir():   # none yet: no runs yet
            raise ClusterError(f"--runs-dir {runs_dir}: not a directory; pass the "
                               "directory your runs are recorded in (train's --runs-dir, "
                               "`runs` by default)")
        self.runs_dir = runs_dir
        self.root = runs_dir.resolve()
        self.loopback = is_loopback(host)
        self.token = token or secrets.token_urlsafe(24)
        # Named after the token: two `ui`s seen from one browser (one host name, other
        # ports, tunnels) each keep their own cookie.
        self.cookie = f"{COOKIE}_{hashlib.sha256(self.token.encode()).hexdigest()[:12]}"
        self.cache_s = cache_s
        self.cluster = _Cached(cluster, cache_s) if cluster is not None else None
        self._settled: dict[str, _Cached] = {}
        self._settled_lock = threading.Lock()
        try:
            self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ClusterError(f"port {port} on {host} is in use (another `ui`?); pass "
                                   "--port with a free port, or --port 0 for any free "
                                   "one") from None
            raise ClusterError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
                               "pass --host with an address of this machine (127.0.0.1 "
                               "by default)") from None
        self.httpd.daemon_threads = True
        self.host = host

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        """Where to open it, with its token."""
        host = self.host
        if host in ("", "0.0.0.0", "::"):
            host = socket.gethostname()
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/?token={self.token}"

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> threading.Thread:
        """Serve in a daemon thread (tests); `close` stops it."""
        thread = threading.Thread(target=self.serve_forever, name="ui", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # What the pages show.

    def summary(self, run: RunDir) -> Summary | None:
        """The run's summary (None: it runs): a run without one is settled from its nodes'
        state (`settle`, over SSH) at most once every CACHE_S seconds."""
        from ..run.settle import settle

        if run.ended:
            return run.summary()
        with self._settled_lock:
            cached = self._settled.setdefault(run.run_id,
                                              _Cached(lambda: settle(run), self.cache_s))
        return cached.get()

    def index(self) -> str:
        rows = [listed(run, self.summary) for run in reversed(list_runs(self.runs_dir))]
        return TEMPLATES.get_template("index.html.j2").render(
            runs=rows, sweeps=self.sweeps(), runs_dir=str(self.runs_dir), refresh=REFRESH_S)

    def sweeps(self) -> list[dict[str, str]]:
        """The sweeps in the runs directory, newest first: a row each for the index."""
        rows = []
        for path in sorted(self.runs_dir.glob(f"*/{SWEEP_JSON}"), reverse=True):
            try:
                record = self.sweep(path.parent.name)
            except SweepUnreadable as exc:   # listed, as `sweep show` names it
                rows.append({"sweep_id": path.parent.name, "state": "unreadable",
                             "href": f"/sweeps/{quote(path.parent.name)}/",
                             "trials": str(exc), "best": "-"})
                continue
            if record is None:
                continue
            done = sum(t.state.done for t in record.trials)
            best = record.ranked()[0] if record.trials else None
            rows.append({"sweep_id": record.sweep_id, "state": record.state,
                         "href": f"/sweeps/{quote(record.sweep_id)}/",
                         "trials": f"{done} of {len(record.trials)} ended",
                         "best": f"t{best.number} {' '.join(best.args)}: {record.metric} "
                                 f"{best.metric:.6g}" if best and best.metric is not None
                                 else "-"})
        return rows

    def sweep(self, sweep_id: str) -> SweepRecord | None:
        """The sweep SWEEP_ID names (a run id's shape), if its record lies inside the runs
        directory once every symlink is followed, settled (sweep/liveness.py) as every verb
        reads it; SweepUnreadable when it does not read."""
        if not RUN_ID.fullmatch(sweep_id):
            return None
        try:
            inside = (self.runs_dir / sweep_id / SWEEP_JSON).resolve(strict=True) \
                .is_relative_to(self.root)
        except (OSError, RuntimeError):
            return None
        try:
            record = open_sweep(self.runs_dir, sweep_id) if inside else None
        except SweepUnreadable:
            raise
        except ClusterError:   # gone meanwhile
            return None
        if record is None:
            return None
        try:
            return settle(record)   # a sweep whose process is gone, as `sweep show` says it
        except OSError:
            return record   # settled here, though its record could not be written

    def holders(self) -> dict[str, list[dict[str, str]]]:
        """{node: the runs in the runs directory that have not ended and run on it}."""
        held: dict[str, list[dict[str, str]]] = {}
        for run in list_runs(self.runs_dir):
            if run.ended:
                continue
            try:
                info = run.info()
                if info.get("queued"):
                    continue
                for node in info.get("nodes") or []:
                    user = (info.get("users") or {}).get(node, "?")
                    held.setdefault(node, []).append(
                        {"run_id": run.run_id, "href": f"/runs/{quote(run.run_id)}/",
                         "user": str(user)})
            except (RecordUnreadable, AttributeError, TypeError):
                continue
        return held

    def nodes(self) -> str:
        view: dict[str, Any] | None = None
        error = ""
        if self.cluster is not None:
            try:
                view = self.cluster.get()
            except Exception as exc:  # noqa: BLE001 - said on the page, not a 500
                error = str(exc) or type(exc).__name__
        held = self.holders()
        rows = []
        if view is not None:
            cordoned = view.get("cordoned") or {}
            rows = [{"name": n, "cordon": cordoned.get(n), "runs": held.get(n, [])}
                    for n in view.get("nodes") or []]
        return TEMPLATES.get_template("nodes.html.j2").render(
            configured=self.cluster is not None, view=view or {}, error=error, rows=rows,
            others=sorted(set(held) - {r["name"] for r in rows}), held=held,
            refresh=REFRESH_S, cache_s=self.cache_s)

    def run_dir(self, run_id: str) -> RunDir | None:
        """The run named by a path's RUN_ID: a run id's shape, or the name of a
        directory in the runs directory (never '.', '..' or a path)."""
        if not RUN_ID.fullmatch(run_id):
            try:
                names = {p.name for p in self.runs_dir.iterdir() if p.is_dir()}
            except OSError:
                return None
            if run_id not in names or run_id in (".", "..") or "/" in run_id:
                return None
        run = RunDir(self.runs_dir, run_id)
        try:
            inside = run.path.resolve(strict=True).is_relative_to(self.root)
        except (OSError, RuntimeError, ValueError):
            return None
        return run if inside and run.path.resolve() != self.root and run.run_json.is_file() \
            else None

    def file(self, run: RunDir, parts: list[str]) -> Path | None:
        """The file PARTS names in RUN's directory, if it is one inside the runs
        directory once every symlink is followed; None for anything else."""
        if not parts or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
            return None
        try:
            path = run.path.joinpath(*parts).resolve(strict=True)
        except (OSError, RuntimeError, ValueError):
            return None
        if not path.is_relative_to(self.root) or path == self.root or not path.is_file():
            return None
        return path


def _content_type(path: Path) -> str:
    if path.suffix in TEXT:
        return "text/plain; charset=utf-8"
    guessed, _ = mimetypes.guess_type(path.name)
    if guessed == "text/html" or (guessed or "").endswith(("json", "svg+xml")):
        return f"{guessed}; charset=utf-8"
    return guessed if guessed and guessed.startswith("text/") else "application/octet-stream"


class _Handler(BaseHTTPRequestHandler):
    """The UI's answer to one request; UI is the server's (set on a subclass per
    server: _handler)."""
    ui: UiServer
    server_version = "clustertrain-ui"
    sys_version = ""

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass   # no access log: the terminal shows the URL and stays quiet

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _not_allowed(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, "only GET and HEAD\n",
                   headers={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _answer(self, body: bool) -> None:
        self._body = body
        url = urlsplit(self.path)
        cookie = self._admitted(url.query)
        if cookie is None:
            return
        extra = {"Set-Cookie": cookie} if cookie else {}
        try:
            self._route(unquote(url.path, errors="strict"), url.path, extra)
        except UnicodeDecodeError:
            self._send(HTTPStatus.NOT_FOUND, "not found\n")
        except RecordUnreadable as exc:   # the record is there: why it cannot be shown
            self._send(HTTPStatus.UNPROCESSABLE_ENTITY, f"cannot show {url.path}: {exc}\n",
                       headers=extra)
        except Exception as exc:  # noqa: BLE001 - the page says it; the server goes on
            print(f"ui: {url.path}: {type(exc).__name__}: {exc}",   # not its ?token=
                  file=sys.stderr)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR,
                       f"cannot show {url.path}: {type(exc).__name__}: {exc}\n")

    def _admitted(self, query: str) -> str | None:
        """None when refused (answered here); else the cookie to set ('' for none).
        Every request carries the token, loopback or not: another user of this
        machine reaches its loopback as well as its owner does."""
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]")
        if self.ui.loopback and host and not is_loopback(host):
            # A page of another site whose name points here (DNS rebinding) is not
            # this user's browser asking: refused.
            self._send(HTTPStatus.FORBIDDEN, f"refused: Host {host!r} is not this "
                       "machine's loopback; open the URL `ui` printed\n")
            return None
        given = (parse_qs(query).get("token") or [""])[0]
        if given and hmac.compare_digest(given.encode(), self.ui.token.encode()):
            return f"{self.ui.cookie}={self.ui.token}; Path=/; HttpOnly; SameSite=Strict"
        try:
            jar = SimpleCookie(self.headers.get("Cookie") or "")
        except CookieError:
            jar = SimpleCookie()
        held = jar[self.ui.cookie].value if self.ui.cookie in jar else ""
        if held and hmac.compare_digest(held.encode(), self.ui.token.encode()):
            return ""
        self._send(HTTPStatus.FORBIDDEN, "refused: this server asks for its token on "
                   "every request; open the URL `ui` printed when it started (it ends "
                   "in ?token=...), or start `ui` again for a new one\n")
        return None

    def _route(self, path: str, raw: str, extra: dict[str, str]) -> None:
        html = "text/html; charset=utf-8"
        if path == "/":
            self._send(HTTPStatus.OK, self.ui.index(), html, extra)
            return
        if path in ("/nodes", "/nodes/"):
            self._send(HTTPStatus.OK, self.ui.nodes(), html, extra)
            return
        parts = path.split("/")
        if len(parts) >= 3 and parts[:2] == ["", "sweeps"]:
            self._sweep(parts, raw, extra)
            return
        run = self.ui.run_dir(parts[2]) if len(parts) >= 3 and parts[:2] == ["", "runs"] else None
        if run is None:
            self._send(HTTPStatus.NOT_FOUND, "not found\n")
        elif len(parts) == 3:   # /runs/RUN: its page is /runs/RUN/ (its links are relative)
            self._send(HTTPStatus.MOVED_PERMANENTLY, "",
                       headers={**extra, "Location": raw + "/"})
        elif parts[3:] == [""]:
            try:   # a run whose controller is gone gets its summary now
                self.ui.summary(run)
            except (ClusterError, OSError):
                pass   # its nodes do not answer: the page shows its record as it is
            page = render_run(run, refresh=None if run.ended else REFRESH_S, served=True)
            self._send(HTTPStatus.OK, page, html, extra)
        elif (found := self.ui.file(run, parts[3:])) is None:
            self._send(HTTPStatus.NOT_FOUND, "not found\n")
        else:
            self._send(HTTPStatus.OK, found.read_bytes(), _content_type(found), extra)

    def _sweep(self, parts: list[str], raw: str, extra: dict[str, str]) -> None:
        try:
            record = self.ui.sweep(parts[2])
        except SweepUnreadable as exc:   # the record is there: why it cannot be shown
            self._send(HTTPStatus.UNPROCESSABLE_ENTITY, f"cannot show sweep {parts[2]}: {exc}\n",
                       headers=extra)
            return
        if record is None or len(parts) > 4 or parts[3:] not in ([], [""]):
            self._send(HTTPStatus.NOT_FOUND, "not found\n")
        elif len(parts) == 3:   # its page is /sweeps/SWEEP/, as a run's
            self._send(HTTPStatus.MOVED_PERMANENTLY, "",
                       headers={**extra, "Location": raw + "/"})
        else:
            running = record.state == "running" or any(
                t.state == TrialState.RUNNING for t in record.trials)
            self._send(HTTPStatus.OK, render_sweep(record, REFRESH_S if running else None,
                                                   served=True),
                       "text/html; charset=utf-8", extra)

    def _send(self, status: HTTPStatus, content: str | bytes,
              kind: str = "text/plain; charset=utf-8",
              headers: dict[str, str] | None = None) -> None:
        data = content.encode("utf-8") if isinstance(content, str) else content
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("X-Frame-Options", "DENY")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if getattr(self, "_body", True) and data:
            self.wfile.write(data)


def _handler(ui: UiServer) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"ui": ui})
