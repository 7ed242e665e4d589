"""A user's own environments (`env create`, `env list`, `env rm`): the python_env role run
as the user, without sudo, into ~/.clustertrain/envs/NAME-KEY on every chosen node
(playbooks/user_env.yml); listed and removed through the node package (node/envs.py)."""

from __future__ import annotations

import secrets
import shlex
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cluster import nodelib, ssh
from ..cluster.fanout import each
from ..cluster.inventory import Cluster, check_env_name
from ..cluster.playbook import run_playbook
from ..defaults import KEEP_ENVS
from ..errors import ClusterError, InputError
from ..node import fingerprint
from ..node.answers import EnvsAnswer
from ..node.requests import Envs
from ..node.util import ago
from ..resources import project
from .envfile import read_environment

PLAYBOOK = "playbooks/user_env.yml"
REPORT_TASK = "Report the environment"   # the playbook's last task: each node's result


class EnvError(ClusterError):
    """An environment file or name that cannot be realised, or nodes that disagree."""


@dataclass(frozen=True)
class EnvFile:
    """An environment file (conda format), read and checked on the controller."""

    path: Path
    name: str                       # its `name:`
    conda: tuple[str, ...]          # its conda dependencies
    pip: tuple[str, ...]            # its pip: section

    @classmethod
    def read(cls, path: Path) -> EnvFile:
        try:
            found = read_environment(path, f"-f {path}", "the environment file (conda "
                                     "format, like the project's environment.yml)")
        except InputError as exc:
            raise EnvError(str(exc)) from None
        if found.name is None or found.conda is None:
            raise EnvError(f"-f {path} is not a conda environment file: it needs 'name:' and "
                           "a 'dependencies:' list (with a '- pip:' list for pip packages)")
        return cls(path.resolve(), found.name, found.conda, found.pip)

    def refuse_for(self, backend: str) -> None:
        """EnvError naming the conda packages a venv cannot honour (backend venv: the
        cluster has no conda), before any node is touched."""
        if backend != "venv":
            return
        # The role's own rule (its venv_checks.yml refuses the same on every node).
        unsupported = project().plugin("filter", "python_env_filters").venv_unsupported(
            self.conda)
        if unsupported:
            raise EnvError(
                f"{self.path} asks conda for {', '.join(unsupported)}, but this cluster has "
                "no conda (its inventory sets python_env_backend: venv): a venv can install "
                "only the pip: section. Move these to the pip: section (as pip packages), "
                "or ask the admin for conda (python_env_backend: conda); no node was touched")


@dataclass
class Created:
    """What `env create` did on each node: {node: the playbook's report}."""

    name: str
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0
    pruned: dict[str, list[str]] = field(default_factory=dict)   # node: directories

    @property
    def keys(self) -> set[str]:
        return {str(r["key"]) for r in self.nodes.values()}

    @property
    def made(self) -> list[str]:
        return [n for n, r in self.nodes.items() if r.get("made")]

    def check_identical(self) -> None:
        """EnvError naming the nodes and packages where the environments differ (another
        file or wheelhouse on one node, a package the index gave another version of)."""
        found = fingerprint.report({n: r["fingerprint"] for n, r in self.nodes.items()})
        if found["lines"] or len(self.keys) > 1:
            raise EnvError(f"env create {self.name}: the environments differ between nodes:"
                           "\n    " + "\n    ".join(found["lines"] or [
                               f"{n}: key {r['key']}" for n, r in self.nodes.items()])
                           + "\n  the nodes must see the same file and the same wheelhouse "
                           "(put it on the share); then run env create again")


def _progress(say: Callable[[str], None]) -> Callable[[dict], bool]:
    """Per node, as the playbook goes: what changed, what failed, and the result."""
    def handler(event: dict) -> bool:
        kind, data = event.get("event"), event.get("event_data", {})
        host, task = data.get("host"), data.get("task")
        res = data.get("res") or {}
        if kind == "runner_on_ok" and task == REPORT_TASK:
            got = res.get("msg") or {}
            how = ("made" if got.get("made") else
                   f"the one {got['shared_with']} made (a home they share)"
                   if got.get("shared_with") else "already there")
            say(f"  {host}: {how} "
                f"{got.get('dir')} ({len((got.get('fingerprint') or {}).get('packages') or {})} "
                "packages)")
        elif kind == "runner_on_ok" and res.get("changed"):
            say(f"  {host}: {task}")
        elif kind in ("runner_on_failed", "runner_on_unreachable") \
                and not data.get("ignore_errors"):
            say(f"  {host}: FAILED {task}: {res.get('msg') or ''}".rstrip())
        return True
    return handler


def create(cluster: Cluster, env_file: EnvFile, name: str, wheelhouse: str | None,
           keep: int = KEEP_ENVS, say: Callable[[str], None] = print) -> Created:
    """Realise ENV_FILE as NAME on every node of CLUSTER, all at once, as the inventory's
    user; EnvError when a node fails or when the nodes' environments differ. Then the
    states of NAME beyond the KEEP newest are removed where no run uses them."""
    check_env_name(name, "environment name")
    if keep < 1:
        raise EnvError(f"--keep {keep}: keep at least the newest state (1 or more)")
    env_file.refuse_for(str(cluster.variables.get("python_env_backend") or "conda"))
    if wheelhouse and not wheelhouse.startswith("/"):
        raise EnvError(f"--wheelhouse {wheelhouse}: give the directory as the nodes see it, "
                       "an absolute path (e.g. on the share: /mnt/cluster/wheelhouse-mine)")
    if wheelhouse:
        _check_wheelhouse(cluster, wheelhouse, name)
    extra = {"user_env_file": str(env_file.path), "user_env_name": name,
             "user_env_wheelhouse": wheelhouse or "", "user_env_nonce": secrets.token_hex(8)}
    created = Created(name)
    started = time.monotonic()
    reports: dict[str, dict[str, Any]] = {}

    def record(event: dict) -> bool:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok" and data.get("task") == REPORT_TASK:
            reports[str(data.get("host"))] = (data.get("res") or {}).get("msg") or {}
        return progress(event)

    progress = _progress(say)
    say(f"env create {name}: {env_file.path} on {', '.join(cluster.names)}"
        + (f", from the wheelhouse {wheelhouse}" if wheelhouse else ", from the nodes' index"))
    with tempfile.TemporaryDirectory(prefix="clustertrain-env-") as tmp:
        result = run_playbook(tmp, project().playbook(PLAYBOOK), cluster.inventory,
                              limit=",".join(cluster.names), extravars=extra,
                              event_handler=record)
    created.seconds = time.monotonic() - started
    created.nodes = {n: reports[n] for n in cluster.names if n in reports}
    if result.rc != 0 or len(created.nodes) < len(cluster.names):
        failed = result.failures or [result.output_tail]
        raise EnvError(f"env create {name} failed on "
                       f"{', '.join(n for n in cluster.names if n not in reports) or 'a node'}: "
                       + "; ".join(failed))
    created.check_identical()
    pruned = _on_nodes(cluster, Envs(name=name, prune=keep))
    created.pruned = {n: r.removed for n, r in pruned.items() if r.removed}
    for node, dirs in created.pruned.items():
        say(f"  {node}: removed the older {', '.join(Path(d).name for d in dirs)} (unused; "
            f"the {keep} newest states of {name} are kept)")
    return created


def _check_wheelhouse(cluster: Cluster, wheelhouse: str, name: str) -> None:
    """The nodes install from WHEELHOUSE themselves: EnvError naming those that cannot read
    it (most often a directory on the controller alone), before anything is made."""
    quoted = shlex.quote(wheelhouse)

    def readable(node: Any) -> bool:
        conn = ssh.connect(node.name, node.ssh)
        try:
            return conn.run(f"test -d {quoted} -a -r {quoted} -a -x {quoted}",
                            timeout=60).exit_code == 0
        finally:
            conn.close()

    blind = [n for n, ok in each(cluster.nodes, readable, lambda n: n.name)
             .values_or_raise().items() if not ok]
    if not blind:
        return
    here = (" (it is a directory on this machine: the nodes read the wheelhouse themselves)"
            if Path(wheelhouse).is_dir() else "")
    raise EnvError(f"--wheelhouse {wheelhouse}: {', '.join(blind)} cannot read it{here}. "
                   "Put it where every node reads it, on the share (e.g. `python -m "
                   "orchestrator wheelhouse --env FILE --dest DIR` with DIR the share's "
                   f"{cluster.shared_path}/wheelhouse-{name} as this machine reaches it), "
                   "and give that path as the nodes see it.")


# -- env list, env rm: through the node package --------------------------------------------
def _on_nodes(cluster: Cluster, request: Envs) -> dict[str, EnvsAnswer]:
    """`node.py envs` (REQUEST) on every node at once: {node: its answer}; ClusterError
    naming the first node that failed."""
    def one(node: Any) -> EnvsAnswer:
        conn = ssh.connect(node.name, node.ssh)
        try:
            return nodelib.ask(conn, node.python, request, node=node.name, timeout=120)
        except nodelib.NodeAnswerError as exc:
            raise ClusterError(f"{node.name}: envs failed: {exc.said}") from None
        finally:
            conn.close()
    return each(cluster.nodes, one, lambda n: n.name).values_or_raise()


@dataclass
class EnvState:
    """One state (NAME-KEY) of an environment, as the nodes have it."""

    name: str
    key: str
    nodes: list[str] = field(default_factory=list)
    current: list[str] = field(default_factory=list)   # nodes where NAME names this one
    size: int = 0                                       # bytes, the largest node's
    last_used: float | None = None
    in_use: dict[str, list[int]] = field(default_factory=dict)   # node: PIDs
    fingerprints: set[str] = field(default_factory=set)
    incomplete: list[str] = field(default_factory=list)  # nodes where env create did not end

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "nodes": self.nodes,
                "current": self.current, "size": self.size, "last_used": self.last_used,
                "in_use": self.in_use, "fingerprints": sorted(self.fingerprints),
                "incomplete": self.incomplete}


def list_envs(cluster: Cluster, name: str | None = None) -> list[EnvState]:
    """Every environment of the user's on the nodes, by name and key."""
    return merge(_on_nodes(cluster, Envs(name=name or None)))


def merge(listed_by_node: dict[str, EnvsAnswer]) -> list[EnvState]:
    """Each node's `node.py envs` answer, as one list of states by name and key."""
    states: dict[tuple[str, str], EnvState] = {}
    for node, listed in listed_by_node.items():
        for env in listed.envs:
            st = states.setdefault((env.name, env.key), EnvState(env.name, env.key))
            st.nodes.append(node)
            if env.current:
                st.current.append(node)
            st.size = max(st.size, env.size)
            if env.last_used and (st.last_used or 0) < env.last_used:
                st.last_used = env.last_used
            if env.in_use:
                st.in_use[node] = env.in_use
            if env.complete:
                st.fingerprints.add(env.fingerprint)
            else:
                st.incomplete.append(node)
    return sorted(states.values(), key=lambda s: (s.name, not s.current, s.key))


def render(states: list[EnvState], nodes: list[str]) -> str:
    if not states:
        return ("no environments of yours on " + ", ".join(nodes) + "; make one: python -m "
                "orchestrator env create -f environment.yml --name NAME")
    rows = [("NAME", "KEY", "NODES", "SIZE", "LAST USED", "IN USE")]
    for s in states:
        where = f"{len(s.nodes)}/{len(nodes)}" + ("" if len(s.nodes) == len(nodes)
                                                   else " (" + ",".join(s.nodes) + ")")
        newest = (" *" if sorted(s.current) == sorted(s.nodes) else
                  f" (* on {','.join(s.current)})" if s.current else "")
        if s.incomplete:
            where += " (unfinished on " + ",".join(s.incomplete) + ")"
        rows.append((s.name + newest, s.key, where,
                     f"{s.size / 2**20:.0f} MiB", ago(s.last_used),
                     ", ".join(f"{n}: {len(p)} process(es)" for n, p in s.in_use.items())
                     or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    notes = ["* the newest of its name: what train --python-env NAME runs"]
    if any(s.incomplete for s in states):
        notes.append("unfinished: an env create that did not end there (interrupted, or it "
                     "failed); env create with the same file finishes it, env rm NAME "
                     "--key KEY removes it")
    return "\n".join(lines + notes)


def remove(cluster: Cluster, name: str, key: str | None = None) -> dict[str, list[str]]:
    """Remove NAME (only its state KEY, when given) from every node; EnvError, removing
    nothing, while a process on any node uses it. {node: directories removed}."""
    check_env_name(name, "environment name")
    states = [s for s in list_envs(cluster, name) if key is None or s.key == key]
    if not states:
        raise EnvError(f"env rm {name}{' --key ' + key if key else ''}: you have no such "
                       f"environment on {', '.join(cluster.names)} (see `env list`)")
    busy = [f"{s.name}-{s.key} on {node} (process {', '.join(map(str, pids))})"
            for s in states for node, pids in s.in_use.items()]
    if busy:
        raise EnvError(f"env rm {name}: in use by a live run: {'; '.join(busy)}; stop the "
                       "run first (python -m orchestrator stop RUN), or wait for its end. "
                       "Nothing was removed")
    done = _on_nodes(cluster, Envs(name=name, rm=True, key=key or None))
    late = {n: r.in_use for n, r in done.items() if r.in_use}
    if late:
        raise EnvError(f"env rm {name}: a run started using it meanwhile on "
                       f"{', '.join(late)}; it was kept there")
    return {n: r.removed for n, r in done.items()}
