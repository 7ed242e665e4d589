"""Benchmark: how long from "go" until torchrun has started on every node.

For 2, 4, 8 and 16 sandbox nodes (one 16-node sandbox; the first N nodes are used), with the
code already synced, a trivial script is started three ways:

  launch   the orchestrator's launch path in-process: SSH connect to every node and
           start torchrun on all of them at once; also timed from the moment every
           connection is open (preflight opened them), and from GO, once every node's
           supervisor is loaded and waits (train's launch after its code sync, which the
           launch's first phase overlaps; launch.py)
  train    the whole `python -m orchestrator train` command line, preflight and sync included
  ansible  `ansible train_nodes -m shell` with the same torchrun command (forks = N)

"Started" is when torchrun runs on the node: the supervisor writes torchrun's process group
to JOB/pgid as soon as it has started it, and that file's modification time is read.
Sandbox nodes share the controller's kernel clock, so node and controller times compare
exactly. To keep setup short, torch is installed once into the sandbox's shared directory
and every node's python_env.json points at it (a benchmark shortcut, not a provisioned node).

    python bench/launch_fanout.py [--sizes 2,4,8,16] [--repeats 3]

Writes bench/results/launch_fanout.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from sandbox_bench import (  # REPO on sys.path
    HOME,
    REPO,
    USER,
    VENV,
    bench_sandbox,
    node_exec,
    sandbox_down,
    sh,
)

from orchestrator.cluster import nodelib  # noqa: E402
from orchestrator.cluster.inventory import load_cluster  # noqa: E402
from orchestrator.cluster.ssh import connect_all  # noqa: E402
from orchestrator.node import requests as rq  # noqa: E402
from orchestrator.record.rundir import RunDir, new_run_id, run_state_dir  # noqa: E402
from orchestrator.run.command import NodeCommand  # noqa: E402
from orchestrator.run.job import Job  # noqa: E402
from orchestrator.run.launch import Launch  # noqa: E402
from orchestrator.run.scheduler import SshScheduler  # noqa: E402
from orchestrator.run.sync import sync_code  # noqa: E402

TRIVIAL = "import os\nprint('rank', os.environ['RANK'], flush=True)\n"


def started_times(containers: list[str], path: str) -> list[float]:
    return [float(node_exec(c, f"stat -c %.9Y {path}").strip()) for c in containers]


def bench_launch(cluster, containers, workdir: Path, runs: Path) -> tuple[float, float, float]:
    """Until torchrun runs on every node: from connecting, from connected (both launch
    phases one after the other), and from GO with every node ready (what `train` waits
    for after its code sync, which phase one overlaps)."""
    run_id = new_run_id()
    sync_code(cluster, workdir, run_id)  # code already synced before the clock starts
    rundir = RunDir(runs, run_id)
    rundir.path.mkdir(parents=True)
    warm = connect_all(list(cluster.nodes))  # the node package is there (preflight puts it)
    for spec in cluster.nodes:
        nodelib.call(warm[spec.name], spec.python, rq.States("/nonexistent"))
        warm[spec.name].close()
    t0 = time.time()
    clients = connect_all(list(cluster.nodes))
    connected = time.time()
    commands = [NodeCommand(run_id=run_id, node_rank=i, nnodes=len(cluster.nodes), nproc=1,
                            master_addr=cluster.nodes[0].cluster_address, master_port=29500,
                            torchrun=f"{VENV}/bin/torchrun", home=HOME,
                            script="trivial.py", node=spec.name, nodes=tuple(cluster.names),
                            run_state=run_state_dir(cluster.shared_path, USER, run_id))
                for i, spec in enumerate(cluster.nodes)]
    nodes = list(zip(cluster.nodes, commands, strict=True))
    # The controller's lines (a stop and its why among them) kept beside the run's record.
    out = open(rundir.path / "controller.out", "w")   # noqa: SIM115 - closed below
    job = Job(rundir, nodes, SshScheduler(clients), out=out)
    launch = Launch.start(nodes, clients)
    assert not launch.ready()
    go = time.time()
    failed = launch.go(os.urandom(32), {})  # returns once torchrun runs on every node
    assert not failed, failed
    result = job.run()
    out.close()
    for c in clients.values():
        c.close()
    assert result.ok, ((rundir.path / "controller.out").read_text()[-3000:], result.outcomes)
    started = max(started_times(containers, f"{commands[0].job_dir}/pgid"))
    return started - t0, started - connected, started - go


def bench_train(inventory: str, n: int, containers, workdir: Path, runs: Path) -> float:
    t0 = time.time()
    sh(sys.executable, "-m", "orchestrator", "train", "-i", inventory, "--nodes", str(n),
       "--workdir", str(workdir), "--runs-dir", str(runs), "trivial.py")
    run_id = sorted(p.name for p in runs.iterdir())[-1]
    return max(started_times(containers, f"{HOME}/.clustertrain/jobs/{run_id}/pgid")) - t0


def bench_ansible(inventory: str, n: int, containers) -> float:
    stamp = "/tmp/bench-ansible-start"
    cmd = (f"date +%s.%N > {stamp}; cd {HOME}/.clustertrain/code/latest && exec "
           f"{VENV}/bin/torchrun --nnodes {n} "
           "--node-rank {{ groups['train_nodes'].index(inventory_hostname) }} "
           "--nproc-per-node 1 "
           "--master-addr {{ hostvars[groups['train_nodes'][0]].cluster_address }} "
           "--master-port 29500 trivial.py")
    t0 = time.time()
    sh(str(Path(sys.executable).parent / "ansible"), f"train_nodes[0:{n - 1}]", "-i",
       inventory, "-f", str(n), "-e", "ansible_become=false", "-m", "ansible.builtin.shell",
       "-a", cmd)
    return max(started_times(containers, stamp)) - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2,4,8,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default=f"orch-bench-{os.getpid()}")
    ap.add_argument("--bastion", action="store_true",
                    help="nodes reachable only through a bastion (ProxyJump)")
    ap.add_argument("--out", default=None, help="default: bench/results/launch_fanout"
                    "[-bastion].json")
    args = ap.parse_args()
    args.out = args.out or str(REPO / "bench" / "results" / (
        "launch_fanout-bastion.json" if args.bastion else "launch_fanout.json"))
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(f"/tmp/{args.name}")
    (work / "code").mkdir(parents=True, exist_ok=True)
    (work / "code" / "trivial.py").write_text(TRIVIAL)
    info = bench_sandbox(args.name, max(sizes), args.bastion)
    results: list[dict] = []
    failure = None
    try:
        cluster_all = load_cluster(info["inventory"])
        for n in sizes:
            cluster = cluster_all.select(nodes=n)
            containers = [x["container"] for x in info["nodes"][:n]]
            row: dict = {"nodes": n, "load_before": os.getloadavg()[0]}
            launches = [bench_launch(cluster, containers, work / "code", work / "runs")
                        for _ in range(args.repeats)]
            for label, times in (
                    ("launch", [total for total, _, _ in launches]),
                    ("launch_connected", [after for _, after, _ in launches]),
                    ("launch_go", [go for _, _, go in launches]),
                    ("train", [bench_train(info["inventory"], n, containers, work / "code",
                                           work / "runs") for _ in range(args.repeats)]),
                    ("ansible", [bench_ansible(info["inventory"], n, containers)
                                 for _ in range(args.repeats)])):
                row[label] = {"median_s": round(statistics.median(times), 3),
                              "all_s": [round(t, 3) for t in times]}
            row["load_after"] = os.getloadavg()[0]
            results.append(row)
            print(json.dumps(row), flush=True)
    except Exception as exc:  # noqa: BLE001 - the sizes measured so far are kept, with why
        failure = f"{n} nodes: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        print(f"{failure}\n{exc}", file=sys.stderr)
    finally:
        sandbox_down(args.name)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "what": "seconds from start until torchrun started on every node (code already "
                "synced); median of repeats; launch: connecting included, launch_connected: "
                "over open connections, both launch phases one after the other; launch_go: "
                "from GO with every node's supervisor ready (train's launch after its code "
                "sync, which phase one overlaps); load_*: 1-minute load average",
        "machine": f"{os.cpu_count()} cores; sandbox containers",
        "ssh": "through a bastion (ProxyJump)" if args.bastion else "direct",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": results, **({"failed": failure} if failure else {})}, indent=2) + "\n")
    print("\n| nodes | launch incl. connecting (s) | launch, connected (s) | from GO (s) | "
          "`train` CLI (s) | `ansible -m shell` (s) |\n|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['nodes']} | {r['launch']['median_s']:.2f} | "
              f"{r['launch_connected']['median_s']:.2f} | {r['launch_go']['median_s']:.2f} | "
              f"{r['train']['median_s']:.2f} "
              f"| {r['ansible']['median_s']:.2f} |")
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
