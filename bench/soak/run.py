"""The soak's executor (issue 69, "a month in an hour"): the seed's schedule (plan.py) run
on a sandbox cluster by its users, its nemesis and its pushing user at their times, then
what the cluster's records say checked against what happened (invariants.py).

    python -m bench.soak.run --seed 1 --minutes 60             # makes a sandbox, removes it
    python -m bench.soak.run --seed 1 --minutes 10 --sandbox soak1   # an existing one

A thread per actor (each researcher, the admin, the nemesis) runs its actions at their
times; a run's `train` and an `attach` go on in the background and their ends are recorded
when they come, so a long action never holds up the actor's next one. A sampler looks at
the nodes every SAMPLE_EVERY seconds (the runs' processes, the daemons' memory, open files
and threads, Slurm's GPU indices of running jobs; the share's records' bytes). At the end
the soak lets what runs finish (DRAIN seconds), stops the rest, looks at the nodes once
more, settles and reads every run's record, and writes into --out (default
bench/results/soak-SEED/): history.jsonl, verdicts.json, report.html, the commands' output
(logs/), what was seen (seen.json).

The sandbox the soak makes (without --sandbox) is tests/shared_cluster.py's, bigger: NODES
nodes behind a bastion with Slurm (2 fake GPUs a node), the users of the Cast (alice with
sudo; bob, carol, dave without), provisioned by the real site.yml.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from . import expect, invariants, nemesis, observe, probe, report, slurm, workload
from .history import Attack, Cordon, Event, Hold, ProcessSeen, RunSeen, Sample
from .plan import ATTACKS, Action, Cast, plan

REPO = workload.REPO
NODES = 4
GPUS_PER_NODE = 2          # the sandbox's fake GPUs (roles/slurm's test double)
SAMPLE_EVERY = 30.0        # s between looks at the nodes
DRAIN = 180.0              # s the runs still going at the end get to finish by themselves
RESULT_CHARS = 200         # of a command's output kept in its event
SHARE_ON_NODES = workload.SHARE


class SoakError(Exception):
    """The soak cannot begin or go on (no such sandbox, a user missing); says what to do."""


@dataclass(frozen=True)
class Cluster:
    """The sandbox as the soak uses it (from `sandbox status --json`)."""
    name: str
    nodes: tuple[str, ...]
    containers: dict[str, str]
    share: Path
    inventories: dict[str, Path]
    ssh_configs: dict[str, Path]

    @classmethod
    def of(cls, info: dict[str, Any]) -> Cluster:
        nodes = tuple(n["name"] for n in info["nodes"] if not n["outsider"])
        return cls(info["name"], nodes, {n["name"]: n["container"] for n in info["nodes"]},
                   Path(info["share"]),
                   {u: Path(v["inventory"]) for u, v in info["users"].items()},
                   {u: Path(v["ssh_config"]) for u, v in info["users"].items()})

    def check(self, cast: Cast) -> None:
        missing = [u for u in (cast.admin, *cast.researchers) if u not in self.inventories]
        if missing:
            raise SoakError(
                f"sandbox {self.name} has no login user {', '.join(missing)}: the soak's "
                f"cast is {cast.admin} (admin) and {', '.join(cast.researchers)}. Make one "
                f"with `python -m orchestrator sandbox up --users "
                f"{','.join(u for u in cast.researchers if u != 'bob')} ...` (or leave out "
                "--sandbox: the soak makes and provisions its own)")
        if len(self.nodes) < NODES:
            raise SoakError(f"sandbox {self.name} has {len(self.nodes)} training nodes; the "
                            f"soak's faults name node0..node{NODES - 1}: make one with "
                            f"--nodes {NODES}")


def environment() -> dict[str, str]:
    """What the commands run with: the repository's podman and Ansible settings, and this
    virtualenv's tools first on PATH (ansible-playbook, ansible)."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "CONTAINERS_CONF": str(REPO / "sandbox" / "containers.conf"),
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PYTHONUNBUFFERED": "1",
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}


def shorten(text: str, chars: int = RESULT_CHARS) -> str:
    """A command's output as its event keeps it: its last line that says something."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return last if len(last) <= chars else last[:chars - 3] + "..."


class Recorder:
    """The history, shared by the threads: each event appended in memory and to
    history.jsonl as it happens (a soak cut short keeps what it did)."""

    def __init__(self, path: Path, t0: float) -> None:
        self.t0 = t0
        self.events: list[Event] = []
        self._lock = threading.Lock()
        self._file = path.open("w")

    def now(self) -> float:
        return round(time.time() - self.t0, 1)

    def add(self, actor: str, kind: str, what: str, args: dict[str, Any] | None = None,
            result: str = "") -> Event:
        event = Event(self.now(), actor, kind, what, dict(args or {}), result)
        with self._lock:
            self.events.append(event)
            self._file.write(json.dumps(report.plain(event)) + "\n")
            self._file.flush()
        return event

    def close(self) -> None:
        self._file.close()


@dataclass
class Started:
    """A run the soak started: by which action, on which nodes, and its `train`."""
    run_id: str
    user: str
    verb: str
    ref: str
    t: float
    hosts: tuple[str, ...]
    output: Path
    proc: subprocess.Popen | None = None    # attached: the train still running
    attached: bool = True


@dataclass
class Looked:
    """What the sampler saw."""
    processes: list[ProcessSeen] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    gpus: dict[str, dict[str, set[int]]] = field(default_factory=dict)   # job -> node -> idx


class Soak:
    def __init__(self, cluster: Cluster, seed: int, seconds: float, out: Path,
                 cast: Cast | None = None, drain: float = DRAIN) -> None:
        self.cluster, self.seed, self.seconds, self.out = cluster, seed, seconds, out
        self.cast, self.drain = cast or Cast(), drain
        self.env = environment()
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()
        self.site = workload.Site(cluster.inventories, cluster.ssh_configs, cluster.nodes,
                                  out / "runs", seed, admin=self.cast.admin)
        for user in (self.cast.admin, *self.cast.researchers):
            self.site.runs_dir(user).mkdir(parents=True, exist_ok=True)
        self.history = Recorder(out / "history.jsonl", self.t0)
        self.started: dict[str, Started] = {}
        self.attacks: list[Attack] = []
        self.cordoned_by_admin: list[str] = []
        self.looked = Looked()
        self.lock = threading.Lock()
        self.ending = threading.Event()
        self.watchers: list[threading.Thread] = []
        self.sequence = 0

    # ---- the schedule -------------------------------------------------------------
    def run(self) -> None:
        actions = plan(self.seed, self.seconds, self.cast)
        by_actor: dict[str, list[Action]] = {}
        for action in actions:
            by_actor.setdefault(action.actor, []).append(action)
        threads = [threading.Thread(target=self._actor, args=(acts,), name=actor, daemon=True)
                   for actor, acts in sorted(by_actor.items())]
        sampler = threading.Thread(target=self._sampler, name="sampler", daemon=True)
        sampler.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=max(self.seconds - (time.time() - self.t0), 0) + 600)
        self.ending.set()
        self._finish()
        sampler.join(timeout=60)

    def _actor(self, actions: list[Action]) -> None:
        for action in actions:
            if not self._sleep_until(action.t):
                return
            try:
                if action.actor == "nemesis":
                    self._fault(action)
                else:
                    self._act(action)
            except Exception as exc:   # noqa: BLE001 - one action's error is its event
                self.history.add(action.actor, "info", action.verb, {"ref": action.ref},
                                 f"the executor failed: {type(exc).__name__}: {exc}")

    def _sleep_until(self, t: float) -> bool:
        """Until T of the soak's clock; False once the soak's time is over."""
        while True:
            left = self.t0 + t - time.time()
            if t >= self.seconds:
                return False
            if left <= 0:
                return True
            time.sleep(min(left, 1.0))

    # ---- the users ----------------------------------------------------------------
    def _act(self, action: Action) -> None:
        node, target = self._choose(action)
        try:
            command = workload.command_for(action, self.site, node=node, target=target)
        except workload.NotImplementedYet as exc:
            self.history.add(action.actor, "info", action.verb,
                             {"ref": action.ref, **action.args},
                             f"{report.NOT_IMPLEMENTED}: {exc}")
            return
        except workload.NothingToAimAt as exc:
            self.history.add(action.actor, "info", action.verb,
                             {"ref": action.ref, **action.args}, f"skipped: {exc}")
            return
        args: dict[str, Any] = {**action.args}
        if action.ref:
            args["ref"] = action.ref
        if command.run_id:
            args["run"] = command.run_id
        if command.hosts:
            args["hosts"] = ",".join(command.hosts)
        if node:
            args["node"] = node
        args["cmd"] = command.shown()
        self.history.add(action.actor, "invoke", action.verb, args)
        with self.lock:
            self.sequence += 1
            output = self.logs / f"{self.sequence:04d}-{action.actor}-{action.verb}.out"
        end_args = {k: v for k, v in args.items() if k in ("ref", "run", "node", "victim")}
        if command.background:
            self._background(action, command, output, end_args)
        else:
            code, text = self._call(command, output)
            self._ended(action, command, code, text, end_args)

    def _choose(self, action: Action) -> tuple[str, str]:
        """The node a cordon, an uncordon or a read names; the run an attack aims at: drawn
        from the seed and the action's time (the admin lifts its own cordons first)."""
        rng = self.site.rng(action.verb, action.t)
        if action.verb == "cordon":
            node = rng.choice(list(self.cluster.nodes))
            self.cordoned_by_admin.append(node)
            return node, ""
        if action.verb == "uncordon":
            if self.cordoned_by_admin:
                return self.cordoned_by_admin.pop(0), ""
            return rng.choice(list(self.cluster.nodes)), ""
        if action.verb in ATTACKS:
            victim = action.args.get("victim", "")
            live = sorted(s.run_id for s in self._live() if s.user == victim)
            return rng.choice(list(self.cluster.nodes)), (rng.choice(live) if live else "")
        return "", ""

    def _live(self) -> list[Started]:
        """The runs the soak started that have no summary yet."""
        with self.lock:
            started = list(self.started.values())
        return [s for s in started
                if (self.site.runs_dir(s.user) / s.run_id / "run.json").exists()
                and not (self.site.runs_dir(s.user) / s.run_id / "summary.json").exists()]

    def _call(self, command: workload.Command, output: Path) -> tuple[int, str]:
        with output.open("w") as fh:
            fh.write(f"$ {command.shown()}\n")
            fh.flush()
            try:
                proc = subprocess.run(list(command.argv), cwd=REPO, env=self.env, stdout=fh,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      timeout=command.timeout)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = 124
                fh.write(f"\n[soak: ended after {command.timeout:.0f} s]\n")
        return code, output.read_text(errors="replace")

    def _background(self, action: Action, command: workload.Command, output: Path,
                    end_args: dict[str, Any]) -> None:
        fh = output.open("w")
        fh.write(f"$ {command.shown()}\n")
        fh.flush()
        proc = subprocess.Popen(list(command.argv), cwd=REPO, env=self.env, stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        if command.starts:
            with self.lock:
                self.started[command.run_id] = Started(
                    command.run_id, action.actor, action.verb, action.ref,
                    self.history.now(), command.hosts, output,
                    proc if action.verb in ("train", "train-queue") else None,
                    attached=action.verb in ("train", "train-queue"))
        watcher = threading.Thread(target=self._watch, daemon=True,
                                   args=(action, command, proc, fh, output, end_args))
        watcher.start()
        with self.lock:
            self.watchers.append(watcher)

    def _watch(self, action: Action, command: workload.Command, proc: subprocess.Popen,
               fh: IO[str], output: Path, end_args: dict[str, Any]) -> None:
        try:
            code = proc.wait(timeout=command.timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)   # as Ctrl-C: a train stops its run
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            fh.write(f"\n[soak: ended after {command.timeout:.0f} s]\n")
        fh.close()
        with self.lock:
            started = self.started.get(command.run_id)
            if started is not None and started.proc is proc:
                started.proc = None
        self._ended(action, command, code, output.read_text(errors="replace"), end_args)

    def _ended(self, action: Action, command: workload.Command, code: int, text: str,
               args: dict[str, Any]) -> None:
        text = text.split("\n", 1)[1] if text.startswith("$ ") and "\n" in text else text
        said = shorten(text)
        if action.verb in ATTACKS:
            got = workload.breached(command, code, text)
            self.attacks.append(Attack(self.history.now(), action.actor, command.victim,
                                       action.verb, tuple(got), said))
            said = (f"{expect.BREACHED}: {'; '.join(got)}" if got else f"refused: {said}")
            args = {**args, "victim": command.victim}
        self.history.add(action.actor, "ok" if code == 0 else "fail", action.verb,
                         {**args, "code": code}, said)

    # ---- the nemesis --------------------------------------------------------------
    def _fault(self, action: Action) -> None:
        node = action.args.get("node", "node0")
        for_s = float(action.args.get("for_s", 30))
        pid, run = None, ""
        if action.verb == "kill-train-9":
            trains = sorted(self._running_trains(), key=lambda s: s.run_id)
            if trains:
                victim = self.site.rng("kill", action.t).choice(trains)
                pid, run, node = victim.proc.pid if victim.proc else None, victim.run_id, ""
        try:
            fault = nemesis.fault_for(action.verb, node or "node0", for_s, self.cluster.name,
                                      self.cluster.containers, pid=pid)
        except workload.NotImplementedYet as exc:
            self.history.add("nemesis", "info", action.verb, dict(action.args),
                             f"{report.NOT_IMPLEMENTED}: {exc}")
            return
        except workload.NothingToAimAt as exc:
            self.history.add("nemesis", "info", action.verb, dict(action.args),
                             f"skipped: {exc}")
            return
        args = {"node": fault.node, "for_s": for_s} if action.verb != "kill-train-9" \
            else {"run": run, "pid": pid}
        # The fault's event is its start (a stall's command lasts the stall); its heal event,
        # when it is over, says what the commands said (a kill -9 is over at once).
        self.history.add("nemesis", "fault", action.verb, args)
        said = self._commands(fault.inject, timeout=for_s + 120)
        time.sleep(fault.hold)
        if fault.heal:
            said = f"{said}; {self._commands(fault.heal, timeout=180)}"
        if fault.wait_ssh:
            said = f"{said}; {self._wait_ssh(fault.node)}"
        self.history.add("nemesis", "heal", action.verb, args, said)

    def _commands(self, commands: tuple[tuple[str, ...], ...], timeout: float) -> str:
        said = []
        for argv in commands:
            try:
                proc = subprocess.run(list(argv), cwd=REPO, env=self.env, capture_output=True,
                                      text=True, timeout=timeout, stdin=subprocess.DEVNULL)
                said.append(shorten(proc.stdout + proc.stderr) or f"exit {proc.returncode}")
                if proc.returncode != 0:
                    said[-1] = f"exit {proc.returncode}: {said[-1]}"
            except subprocess.TimeoutExpired:
                said.append(f"did not end within {timeout:.0f} s")
        return "; ".join(said)

    def _wait_ssh(self, node: str, timeout: float = 120.0) -> str:
        """Until NODE answers SSH as the admin again (its services back); what is wrong
        if it does not within TIMEOUT."""
        deadline = time.time() + timeout
        argv = workload.ssh(self.site, self.cast.admin, node, "systemctl is-system-running")
        state = ""
        while time.time() < deadline:
            proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                                  timeout=60, stdin=subprocess.DEVNULL)
            state = proc.stdout.strip()
            if state in ("running", "degraded"):
                return f"{node} answers ({state})"
            time.sleep(2)
        return f"{node} did not answer SSH within {timeout:.0f} s ({state or 'no answer'})"

    # ---- the sampler --------------------------------------------------------------
    def _sampler(self) -> None:
        while not self.ending.is_set():
            self.look()
            self.ending.wait(SAMPLE_EVERY)

    def look(self) -> None:
        """The runs' processes and the daemons on every node, Slurm's running jobs' GPUs,
        the share's records."""
        t = self.history.now()
        users = [self.cast.admin, *self.cast.researchers]
        script = probe.scan_script(users) + "; echo '--daemons'; " + probe.daemons_script()
        for node in self.cluster.nodes:
            text = self._exec(node, script)
            scan, _, daemons = text.partition("--daemons")
            found = probe.parse_scan(scan, node, t)
            with self.lock:
                self.looked.processes += [p for p, _ in found]
                self.looked.samples += [s for _, s in found]
                self.looked.samples += probe.parse_daemons(daemons, node, t)
        jobs = self._exec(nemesis.CONTROLLER, slurm.RUNNING_GPUS)
        with self.lock:
            for job, node, idx in slurm.parse_running_gpus(jobs):
                self.looked.gpus.setdefault(job, {}).setdefault(node, set()).update(idx)
            self.looked.samples.append(Sample(t, "share records",
                                              rss=probe.records_bytes(self.cluster.share)))

    def _exec(self, node: str, script: str) -> str:
        try:
            proc = subprocess.run(["podman", "exec", self.cluster.containers[node], "sh", "-c",
                                   script], env=self.env, capture_output=True, text=True,
                                  timeout=60)
        except subprocess.TimeoutExpired:
            return ""
        return proc.stdout if proc.returncode == 0 else ""

    # ---- the end ------------------------------------------------------------------
    def _finish(self) -> None:
        """Let what runs finish (DRAIN s), stop the rest as their users would, settle."""
        deadline = time.time() + self.drain
        while time.time() < deadline:
            self._settle()   # a detached run that ended has a summary once settled
            if not self._running_trains() and not self._live():
                break
            time.sleep(20)
        for s in self._running_trains():
            self.history.add("soak", "invoke", expect.STOP_AT_END, {"run": s.run_id},
                             "Ctrl-C to its train")
            if s.proc is not None:
                try:
                    os.killpg(s.proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 120   # a stopped train tears its run down, then ends
        while self._running_trains() and time.time() < deadline:
            time.sleep(2)
        self._settle()
        for s in self._live():
            self.history.add("soak", "invoke", expect.STOP_AT_END, {"run": s.run_id},
                             "stop RUN as its user")
            self._call(workload.Command(s.user, workload.orchestrator(
                self.site, "stop", s.run_id, "--runs-dir", str(self.site.runs_dir(s.user)),
                "-i", str(self.site.inventories[s.user])), timeout=120),
                self.logs / f"stop-at-end-{s.run_id}.out")
        with self.lock:
            watchers = list(self.watchers)
        for watcher in watchers:
            watcher.join(timeout=120)
        time.sleep(invariants.ENDED_SLACK + 5)   # what outlives its run by more is left behind
        self._settle()
        self.look()

    def _running_trains(self) -> list[Started]:
        with self.lock:
            return [s for s in self.started.values() if s.proc is not None
                    and s.proc.poll() is None]

    def _settle(self) -> None:
        """`runs` as each user: a run whose controller is gone gets its summary."""
        for user in (self.cast.admin, *self.cast.researchers):
            self._call(workload.Command(user, workload.orchestrator(
                self.site, "runs", "--runs-dir", str(self.site.runs_dir(user))), timeout=300),
                self.logs / f"runs-{user}.out")

    # ---- what the records say -----------------------------------------------------
    def seen(self) -> tuple[invariants.Seen, list[RunSeen]]:
        from orchestrator.record.rundir import RecordUnreadable, list_runs

        runs: list[RunSeen] = []
        holds: list[Hold] = []
        jobs: dict[str, str] = {}
        history = list(self.history.events)
        node_gpus = dict.fromkeys(self.cluster.nodes, GPUS_PER_NODE)
        for user in (self.cast.admin, *self.cast.researchers):
            for record in list_runs(self.site.runs_dir(user)):
                try:
                    summary = record.summary()
                    info = record.info()
                except RecordUnreadable as exc:
                    self.history.add("soak", "info", "record", {"run": record.run_id},
                                     f"unreadable: {exc}")
                    continue
                first = (summary.recovery_of if summary and summary.recovery_of
                         else record.run_id.split(".r")[0])
                started = self.started.get(first)
                shown = self._shown(record.path, started, record.run_id == first)
                if summary is None:
                    runs.append(RunSeen(record.run_id, user, "running",
                                        observe.on_clock(info.get("start"), self.t0) or 0.0,
                                        None, tuple(info.get("nodes") or ()), shown=shown))
                    continue
                nodes = [n.name for n in summary.nodes]
                start = started.t if started else (observe.on_clock(summary.start, self.t0)
                                                   or 0.0)
                wanted = expect.expected(
                    record.run_id, user, started.verb if started else "", nodes, start,
                    observe.on_clock(summary.end, self.t0), history,
                    chain=(first,), last_attempt=summary.recovered_in is None)
                runs.append(observe.run_seen(summary, user, self.t0, shown,
                                             allowed=wanted.allowed,
                                             may_recover=wanted.may_recover,
                                             changed_by=wanted.changed_by))
                holds += observe.holds_of(summary, self.t0, node_gpus)
                job = (summary.info.get("slurm") or {}).get("job_id")
                if job:
                    jobs[str(job)] = record.run_id
        holds += self._slurm_holds()
        checkpoints = {path: self._loads(path) for run in runs for path in run.saved}
        with self.lock:
            looked = Looked(list(self.looked.processes), list(self.looked.samples),
                            dict(self.looked.gpus))
        return invariants.Seen(runs=runs, holds=holds, processes=looked.processes,
                               samples=looked.samples, cordons=self._cordons(),
                               checkpoints=checkpoints, jobs=jobs,
                               admins=frozenset({self.cast.admin, "root"}),
                               attacks=list(self.attacks)), runs

    def _shown(self, path: Path, started: Started | None, first: bool) -> tuple[str, ...]:
        """What the run's user was shown: its train's output (attached), else its
        nodes' logs in its record."""
        if started is not None and started.attached and first and started.output.exists():
            return tuple(started.output.read_text(errors="replace").splitlines())
        lines: list[str] = []
        for log in sorted(path.glob("*.log")):
            lines += log.read_text(errors="replace").splitlines()
        return tuple(lines)

    def _slurm_holds(self) -> list[Hold]:
        """Slurm's accounting of the soak's time: each allocation's GPUs (their indices as
        the sampler saw them while the job ran) from its start to its end."""
        since = datetime.fromtimestamp(self.t0 - 60).strftime("%Y-%m-%dT%H:%M:%S")
        text = self._exec(nemesis.CONTROLLER, f"sacct -X -P -n -a -S {since} "
                          "-o JobID,User,NodeList,Start,End,AllocTRES")
        holds = []
        for job, start, end in slurm.parse_sacct(text, self.t0):
            for node, idx in sorted(self.looked.gpus.get(job, {}).items()):
                holds += [Hold("slurm", job, node, gpu, start, end) for gpu in sorted(idx)]
        return holds

    def _cordons(self) -> list[Cordon]:
        from orchestrator.cluster.drain import cordon_record
        from orchestrator.cluster.inventory import load_cluster

        try:
            found = cordon_record(load_cluster(self.cluster.inventories[self.cast.admin]))
        except Exception as exc:   # noqa: BLE001 - said in the history, not fatal
            self.history.add("soak", "info", "cordons", {}, f"could not be read: {exc}")
            return []
        return [Cordon(node, str(event.get("by", "")), str(event.get("why", "")))
                for node, event in sorted(found.cordoned.items())]

    def _loads(self, path: str) -> bool:
        """Whether the checkpoint at PATH (on the nodes) is there and reads (torch.load
        of the share's file, on this machine)."""
        local = self.cluster.share / Path(path).relative_to(SHARE_ON_NODES)
        if not local.is_file():
            return False
        try:
            import torch
        except ImportError:
            return local.stat().st_size > 0
        try:
            torch.load(local, map_location="cpu", weights_only=False)
        except Exception:   # noqa: BLE001 - any failure to read is the verdict
            return False
        return True


# ---- the command line -------------------------------------------------------------------
def make_sandbox(name: str, cast: Cast, say: Callable[[str], None]) -> None:
    """A sandbox as the sandbox tests' (tests/shared_cluster.py), of NODES nodes, with the
    cast's researchers as login users."""
    shared_cluster = _shared_cluster()
    extra = tuple(u for u in cast.researchers if u != "bob")
    try:
        shared_cluster.up([name], say=say, nodes=NODES, users=extra)
    except shared_cluster.ProvisionFailed as exc:
        raise SoakError(f"the soak's sandbox {name} could not be made: {exc}") from None


def _shared_cluster() -> Any:
    """tests/shared_cluster.py, which makes the sandbox tests' clusters (imported by name:
    the repository's tests are no package of the benchmarks')."""
    return importlib.import_module("tests.shared_cluster")


def sandbox_info(name: str) -> dict[str, Any]:
    from orchestrator.errors import SandboxError
    from orchestrator.sandbox import cluster

    try:
        return cluster.status(name)
    except SandboxError as exc:
        raise SoakError(str(exc)) from None


def write_results(soak: Soak, meta: report.Soak) -> dict[str, list[Any]]:
    seen, runs = soak.seen()
    results = invariants.check(seen)
    history = list(soak.history.events)
    out = soak.out
    (out / "verdicts.json").write_text(json.dumps(
        report.verdicts_json(meta, results, history, runs), indent=1, default=str) + "\n")
    (out / "report.html").write_text(report.render(meta, results, history, runs))
    (out / "seen.json").write_text(json.dumps(report.plain({
        "runs": seen.runs, "holds": seen.holds, "cordons": seen.cordons,
        "checkpoints": seen.checkpoints, "jobs": seen.jobs, "attacks": seen.attacks,
        "processes": seen.processes, "samples": len(seen.samples)}), indent=1, default=str))
    return {name: list(found) for name, found in results.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak.run",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--minutes", type=float, required=True,
                        help="of schedule; the drain, the stops and the checks follow")
    parser.add_argument("--sandbox", help="use this existing sandbox (4 nodes, Slurm, users "
                        "alice, bob, carol, dave, provisioned) instead of making one")
    parser.add_argument("--out", type=Path, help="default: bench/results/soak-SEED/")
    parser.add_argument("--drain", type=float, default=DRAIN,
                        help=f"seconds the runs still going at the end get (default {DRAIN:g})")
    parser.add_argument("--keep", action="store_true",
                        help="keep the sandbox the soak made (its name is printed)")
    args = parser.parse_args(argv)
    out = args.out or REPO / "bench" / "results" / f"soak-{args.seed}"
    cast = Cast()

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
    made = ""
    try:
        name = args.sandbox
        if not name:
            made = name = f"soak{args.seed}-{secrets.token_hex(2)}"
            say(f"making and provisioning the sandbox {name} (minutes)")
            make_sandbox(name, cast, say)
        cluster = Cluster.of(sandbox_info(name))
        cluster.check(cast)
        out.mkdir(parents=True, exist_ok=True)
        soak = Soak(cluster, args.seed, args.minutes * 60, out, cast, drain=args.drain)
        command = f"python -m bench.soak.run --seed {args.seed} --minutes {args.minutes:g}"
        meta = report.Soak(args.seed, args.minutes, name, command,
                           datetime.now(timezone.utc).isoformat(timespec="seconds"))
        say(f"soak seed {args.seed}: {args.minutes:g} minutes on {name}; results in {out}")
        try:
            soak.run()
            results = write_results(soak, meta)
        finally:
            soak.history.close()
    except SoakError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    finally:
        if made and not args.keep:
            _shared_cluster().down(made)
    broken = {name: len(found) for name, found in results.items() if found}
    say(f"soak seed {args.seed}: " + (f"violations: {broken}" if broken
                                      else "every invariant held") + f"; {out}/report.html")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
