"""The project's GPU paths, run on a machine with an NVIDIA GPU (none in CI or the
sandbox): what the roles and preflight read of the GPU, and the flight recorder of a real
NCCL job through the node-side code that launches and diagnoses runs.

    python3 bench/gpu_checks.py --out DIR   (needs torch with CUDA, and py-spy on PATH
                                              or --py-spy; root or the job's own user)

Writes DIR/gpu_checks.json (every check: ok, what it read) and the flight-recorder dumps
it took (DIR/nccl_fr_rank0.pkl, on request while a NCCL collective was in flight;
DIR/nccl_timeout_rank0.pkl, torch's own dump when that collective timed out), which the
unit tests read as recorded dumps (tests/orchestrator/hang_dumps/nccl/).

The node side is the one a run uses: the node package's `supervise` starts torchrun with the
environment NodeCommand.environment() gives every run (flight recorder on, its timeout
dump into the job), workers go through `node.py worker`, and the package's `dump` takes the
py-spy stacks and flight records that `diagnose` reads; orchestrator/diagnosis/hang.py
analyses them.

Also: busy.py's reading of nvidia-smi (the raw answers are kept as the unit tests'
recorded nvidia-smi output), the tutorial's resume on a GPU (a run stopped mid-way and
started again; its GPU checkpoint resumed on the CPU), and the nvidia_driver role on a
node whose driver works (check mode, then twice for real: nothing changed). The role needs
ansible-core, which GPU images seldom hold: carry it as wheels (bench/README.md).

One GPU is enough for the flight-recorder checks: a world of one NCCL rank whose
all_reduce waits behind a long GPU kernel (torch.cuda._sleep) is in flight, as a hung
collective is, and with a 10 s process group timeout it times out, so the NCCL watchdog
dumps the recorder as it would on a cluster.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import zlib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.cluster import nodelib  # noqa: E402
from orchestrator.diagnosis import hang  # noqa: E402
from orchestrator.node import busy, dump as node_dump, protocol, terminate as node_stop  # noqa: E402
from orchestrator.run import command  # noqa: E402

FINGERPRINT = ROOT / "roles" / "python_env" / "files" / "fingerprint.py"
DETECT = ROOT / "roles" / "nvidia_driver" / "tasks" / "detect.yml"
RUNNER = ROOT / "orchestrator" / "node" / "entry.py"  # the worker runner, as in a checkout

JOB = """
    import os, sys, time, datetime
    import torch, torch.distributed as dist
    mode = sys.argv[1]
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    # "timeout": the watchdog ends the run after 10 s; "request": dumped long before.
    seconds = 10 if mode == "timeout" else 300
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=seconds))
    t = torch.ones(1 << 20, device="cuda")
    for _ in range(3):
        dist.all_reduce(t)
    dist.broadcast(t, 0)
    torch.cuda.synchronize()
    print("steps done", flush=True)
    if mode == "mismatch":  # rank 0 broadcasts where the others all_reduce
        def sync_weights():
            dist.broadcast(t, 0)
        def train_step():
            dist.all_reduce(t)
        (sync_weights if dist.get_rank() == 0 else train_step)()
        print("in flight", flush=True)
        t.sum().item()  # every rank waits here, past its collective: the stacks agree
        sys.exit(0)
    def held_up_on_the_gpu():
        torch.cuda._sleep(int(1.9e9 * 60))  # a minute of GPU time before the collective
    held_up_on_the_gpu()
    def train_step():
        dist.all_reduce(t)   # enqueued behind the sleep: in flight, not completed
    train_step()
    print("in flight", flush=True)
    torch.cuda.synchronize()  # waits here (GIL released) until the timeout ends it
"""


HOLDER = """
import time, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # held: 1 GiB on GPU 0
torch.cuda.synchronize()
print("held", flush=True)
time.sleep(300)
"""


def smi(args: list[str]) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True,
                          timeout=30).stdout


def check(results: dict, out: Path, name: str, only: set[str]):
    """Run one check (all, or those in ONLY); record what it returned, or its error,
    under NAME (ok: None for a check that says it was skipped), and write every result so
    far to OUT, so that a run cut short keeps what it found."""
    def wrap(fn):
        if only and name not in only:
            return fn
        t0 = time.time()
        try:
            found = fn()
            results[name] = {"ok": None if "skipped" in found else True, **found}
        except Exception as exc:  # noqa: BLE001 - each check reports, the rest go on
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()[-2000:]}
        results[name]["seconds"] = round(time.time() - t0, 2)
        print(f"{name}: {json.dumps(results[name])[:600]}", flush=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        return fn
    return wrap


def load_fingerprint() -> dict:
    ns: dict = {"__name__": "clustertrain_fingerprint"}
    exec(compile(FINGERPRINT.read_text(), str(FINGERPRINT), "exec"), ns)  # noqa: S102
    return ns


def role_detection() -> dict:
    """The nvidia_driver role's detection: its own shell loop, its own patterns."""
    tasks = yaml.safe_load(DETECT.read_text())
    loop = tasks[0]["ansible.builtin.shell"]["cmd"].replace(
        "{{ nvidia_driver_pci_devices_path | quote }}", "/sys/bus/pci/devices")
    out = subprocess.run(["bash", "-c", loop], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    return {"gpus": sum(bool(re.match(r"^\S+ 0x10de 0x03", x)) for x in lines),
            "nvswitches": sum(bool(re.match(r"^\S+ 0x10de 0x0680", x)) for x in lines),
            "nvidia_devices": [x for x in lines if " 0x10de " in x]}


def start_run(work: Path, run_id: str, mode: str,
              nproc: int = 1) -> tuple[Path, subprocess.Popen, dict]:
    """The node package's `supervise` of a one-node job (NPROC ranks, all on GPU 0), as a
    launch starts it, from the package installed in the job's home as on a node."""
    home = work / "home"
    cmd = command.NodeCommand(
        run_id=run_id, node_rank=0, nnodes=1, nproc=nproc, master_addr="127.0.0.1",
        master_port=29571 + ["request", "timeout", "mismatch"].index(mode),
        torchrun=str(Path(sys.executable).parent / "torchrun"),
        home=str(home), script="job.py", script_args=(mode,), node="gpu0", nodes=("gpu0",),
        addresses=("127.0.0.1",),
        python=sys.executable, run_state=str(work / "state" / run_id), attached=False)
    code, job = Path(cmd.code_dir), Path(cmd.job_dir)
    (job / protocol.FR_SUBDIR).mkdir(parents=True)
    code.mkdir(parents=True)
    (code / "job.py").write_text(textwrap.dedent(JOB))
    env = {**os.environ, **cmd.environment(), "HOME": str(home)}
    installed = subprocess.run(["bash", "-c", nodelib.install_command()], env=env, text=True,
                               input=base64.b64encode(nodelib.bundle().tar_gz).decode())
    assert installed.returncode == 0, "could not install the node package"
    argv = [sys.executable, nodelib.entry(str(home)), "supervise",
            "--job", str(job), "--state-dir", cmd.run_state, "--run", run_id,
            "--node", "gpu0", "--nodes", "gpu0", "--addresses", "127.0.0.1",
            "--", *cmd.torchrun_argv()]
    proc = subprocess.Popen(argv, cwd=code, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    return job, proc, env


def wait_for(path: Path, text: str, seconds: float, times: int = 1) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if path.exists() and path.read_text(errors="replace").count(text) >= times:
            return
        if (path.parent / "exit").exists():
            break
        time.sleep(0.2)
    raise TimeoutError(f"{text!r} not in {path} after {seconds} s:\n"
                       + (path.read_text(errors="replace")[-3000:] if path.exists() else ""))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    p.add_argument("--only", default="", help="comma-separated names of checks to run")
    args = p.parse_args()
    only = set(filter(None, args.only.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    work = Path(tempfile.mkdtemp(prefix="gpu-checks-"))
    out = args.out / "gpu_checks.json"

    @check(results, out, "nvidia_smi", only)
    def _() -> dict:
        return {"gpus": smi(["--query-gpu=name,driver_version,memory.total",
                             "--format=csv,noheader"]).strip().splitlines()}

    @check(results, out, "role_detection", only)
    def _() -> dict:
        return role_detection()

    @check(results, out, "fingerprint", only)
    def _() -> dict:
        fp = load_fingerprint()
        return {"driver_version": fp["driver_version"](), "gpu_count": fp["gpu_count"](),
                "pci_gpus": fp["pci_gpus"](), "checks": fp["checks"]()}

    @check(results, out, "torch_names", only)
    def _() -> dict:
        import torch

        lib = Path(torch.__file__).parent / "lib"
        names: set[bytes] = set()
        for so in lib.glob("libtorch_cuda*.so"):
            names |= set(re.findall(rb"TORCH_(?:FR|NCCL)_[A-Z_]+", so.read_bytes()))
        return {"torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                "dump_functions": sorted(n for n in dir(torch._C._distributed_c10d)
                                         if "dump" in n),
                "env_names": sorted(n.decode() for n in names)}

    @check(results, out, "flight_recorder_on_request", only)
    def _() -> dict:
        job, proc, _env = start_run(work, "gpu-fr-request", "request")
        try:
            wait_for(job / "output.log", "in flight", 120)
            time.sleep(1.0)
            dumps = node_dump.dump_workers(str(job), "gpu-fr-request", args.py_spy, False)
            # what preflight tells the next user of this node: this run, on GPU 0
            seen = busy.scan().to_json()
        finally:
            node_stop.stop_tree(str(job), "gpu-fr-request", 5.0)
            proc.wait(timeout=60)
        (rank,) = dumps
        found = {"pid": rank["pid"], "py_spy": "dump" in rank,
                 "py_spy_error": rank.get("error"), "fr_error": rank.get("fr_error"),
                 "busy_runs": seen["runs"], "busy_bare": seen["gpu_processes"]}
        if not any(r["run"] == "gpu-fr-request" and r["gpus"] == [0] for r in seen["runs"]):
            raise AssertionError(f"busy.scan() did not name the run on GPU 0: {seen}")
        rid = hang.RankId("gpu0", rank["rank"], rank["pid"])
        if "fr" in rank:
            data = zlib.decompress(base64.b64decode(rank["fr"]))
            (args.out / "nccl_fr_rank0.pkl").write_bytes(data)
            rec = hang.parse_flight_record(data, rid)
            seq, entry, state = rec.last(0)
            found.update(version=rec.version, last_seq=seq, last_op=entry and entry.op,
                         last_state=state, entries=len(rec.entries),
                         ops=[e.profiling_name for e in rec.entries])
        if "dump" in rank:
            (args.out / "nccl_pyspy_rank0.json").write_text(rank["dump"])
            found["where"] = str(hang.locate(hang.parse_pyspy_dump(rank["dump"], rid)))
        return found

    @check(results, out, "gpu_processes", only)
    def _() -> dict:
        """busy.py (preflight's "who else is on these GPUs", the `busy` verb) with a bare
        process of ours holding 1 GiB on GPU 0, then with the GPU idle. nvidia-smi's raw
        answers to busy.py's two queries are kept: the unit tests' recorded output."""
        holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE,
                                  text=True, start_new_session=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            gpus = smi(busy.QUERY_GPUS)
            apps = smi(busy.QUERY_APPS)
            held = busy.scan()
        finally:
            holder.kill()
            holder.wait()
        deadline = time.time() + 30
        while str(holder.pid) in smi(busy.QUERY_APPS) and time.time() < deadline:
            time.sleep(0.5)
        idle_apps = smi(busy.QUERY_APPS)
        idle = busy.scan()
        (args.out / "query-gpu.csv").write_text(gpus)
        (args.out / "query-compute-apps.held.csv").write_text(apps)
        (args.out / "query-compute-apps.idle.csv").write_text(idle_apps)
        mine = [g for g in held.gpu_processes if g.pid == holder.pid]
        if not (mine and mine[0].gpu == 0 and (mine[0].used_mib or 0) >= 1024
                and mine[0].user and mine[0].command):
            raise AssertionError(f"busy.scan() did not name the holder ({holder.pid}) on "
                                 f"GPU 0 with >= 1024 MiB: {held.to_json()}")
        if any(g.pid == holder.pid for g in idle.gpu_processes):
            raise AssertionError(f"the holder is still listed after it ended: {idle.to_json()}")
        return {"held": held.to_json(), "idle": idle.to_json(), "raw_gpus": gpus,
                "raw_apps": apps, "raw_idle": idle_apps}

    @check(results, out, "resume_on_gpu", only)
    def _() -> dict:
        """The tutorial's resume on a GPU: train.py through the worker runner (as a run
        starts it), stopped with SIGTERM (what `stop` and Ctrl-C send) once its first
        checkpoint is written, then the same command again; and the stopped run's GPU
        checkpoint resumed on the CPU (a spare without a GPU, or a laptop)."""
        from orchestrator.provision.data import SyntheticSpec, write_synthetic

        data = work / "resume-data"
        write_synthetic(data, SyntheticSpec(train_per_class=1000, test_per_class=50))
        ckpt, cpu_ckpt = work / "resume-ckpt", work / "resume-ckpt-cpu"

        def job(ckpt_dir: Path, *extra: str) -> list[str]:
            return [str(Path(sys.executable).parent / "torchrun"), "--standalone",
                    "--nproc-per-node", "1", str(RUNNER), "worker",
                    str(ROOT / "train" / "train.py"), "--data-dir", str(data),
                    "--checkpoint-dir", str(ckpt_dir), "--epochs", "3", "--width", "32",
                    "--batch-size", "128", "--log-every", "1000", *extra]

        first = subprocess.Popen(job(ckpt), cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
        deadline = time.time() + 180
        while not list(ckpt.glob("ckpt-*.pt")) and first.poll() is None:
            assert time.time() < deadline, "no checkpoint within 180 s"
            time.sleep(0.05)
        os.killpg(first.pid, 15)
        said, _ = first.communicate(timeout=120)
        stopped_at = sorted(x.name for x in ckpt.glob("ckpt-*.pt"))
        shutil.copytree(ckpt, cpu_ckpt)
        found: dict = {"first_exit": first.returncode, "checkpoints_after_stop": stopped_at,
                       "first_tail": said[-600:]}
        for name, ckpt_dir, extra in (("gpu", ckpt, ()),
                                      ("cpu", cpu_ckpt, ("--device", "cpu"))):
            again = subprocess.run(job(ckpt_dir, *extra), cwd=ROOT, capture_output=True,
                                   text=True, timeout=400)
            lines = again.stdout.splitlines()
            resumed = [x for x in lines if "resumed from" in x]
            final = [x for x in lines if x.startswith("FINAL_METRICS ")]
            found[name] = {"exit": again.returncode, "resumed": resumed[-1:],
                           "final": json.loads(final[0].split(" ", 1)[1]) if final else None,
                           "tail": (again.stdout + again.stderr)[-800:]}
            if again.returncode != 0 or not resumed or not final:
                raise AssertionError(f"{name}: the rerun did not resume and finish: {found}")
        return found

    @check(results, out, "nvidia_driver_role", only)
    def _() -> dict:
        """The nvidia_driver role on this node, whose driver works: check mode, then two
        real runs (local connection). The working driver is left alone and verified with
        nvidia-smi, and no run changes anything. nvidia-persistenced is left out: this VM
        has no systemd."""
        try:
            import ansible  # noqa: F401
        except ImportError:
            return {"skipped": "ansible-core is not installed (carry it as wheels)"}
        play = work / "driver.yml"
        play.write_text("- hosts: localhost\n  connection: local\n  gather_facts: true\n"
                        "  roles: [nvidia_driver]\n")
        (work / "ansible.cfg").write_text("[defaults]\n")  # not the project's: no inventory
        env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
               "ANSIBLE_CONFIG": str(work / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
               "ANSIBLE_PYTHON_INTERPRETER": sys.executable, "LC_ALL": "C.UTF-8",
               "ANSIBLE_LOCAL_TEMP": str(work / "ansible-tmp")}
        found: dict = {}
        for name, extra in (("check", ["--check"]), ("first", []), ("second", [])):
            ran = subprocess.run([sys.executable, "-m", "ansible.cli.playbook", "-i",
                                  "localhost,", str(play), "-e",
                                  "nvidia_driver_persistenced=false", *extra],
                                 capture_output=True, text=True, timeout=300, env=env)
            recap = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)"
                              r"\s+failed=(\d+)\s+skipped=(\d+)", ran.stdout)
            kept = re.findall(r"driver \S+ works and is at least \S+", ran.stdout)
            found[name] = {"exit": ran.returncode,
                           "recap": dict(zip(("ok", "changed", "unreachable", "failed",
                                              "skipped"), map(int, recap.groups()), strict=True))
                           if recap else None, "left_alone": kept[:1],
                           "tail": ran.stdout[-1500:] + ran.stderr[-500:]}
            if (ran.returncode != 0 or not recap or found[name]["recap"]["changed"] != 0
                    or (shutil.which("nvidia-smi") and not kept)):
                raise AssertionError(f"{name}: {found[name]}")
        return found

    @check(results, out, "training_job_throughput", only)
    def _() -> dict:
        """The project's training job (train/train.py) on the GPU through torchrun, fp32
        and bf16 autocast (--amp), on synthetic data: samples/s of the last epoch."""
        from orchestrator.provision.data import SyntheticSpec, write_synthetic

        data = work / "data"
        write_synthetic(data, SyntheticSpec(train_per_class=2000, test_per_class=100))
        found = {"model": "ResNet width 64, 2 blocks a stage", "batch": 512, "images": 20000}
        for amp in ("off", "on"):
            ckpt = work / f"ckpt-{amp}"
            out = subprocess.run(
                [str(Path(sys.executable).parent / "torchrun"), "--standalone",
                 "--nproc-per-node", "1", str(ROOT / "train" / "train.py"), "--data-dir",
                 str(data), "--checkpoint-dir", str(ckpt), "--epochs", "4", "--batch-size",
                 "512", "--width", "64", "--blocks", "2", "--amp", amp, "--no-resume"],
                cwd=ROOT, capture_output=True, text=True, timeout=400)
            if out.returncode != 0:
                raise RuntimeError(f"--amp {amp}: exit {out.returncode}: "
                                   f"{(out.stdout + out.stderr)[-1500:]}")
            history = json.loads((ckpt / "metrics.json").read_text())["history"]
            found[f"amp_{amp}"] = {"samples_per_s": [round(h["samples_per_s"]) for h in history],
                                   "final_train_acc": round(history[-1]["train_acc"], 3)}
        return found

    @check(results, out, "flight_recorder_on_timeout", only)
    def _() -> dict:
        job, proc, _env = start_run(work, "gpu-fr-timeout", "timeout")
        try:
            proc.wait(timeout=240)  # the watchdog's timeout (10 s) ends the run
        finally:
            node_stop.stop_tree(str(job), "gpu-fr-timeout", 5.0)
        fr = job / protocol.FR_SUBDIR
        files = sorted(x.name for x in fr.iterdir())
        log = (job / "output.log").read_text(errors="replace")
        found = {"files": files, "exit": json.loads((job / "exit").read_text()),
                 "log_tail": log[-2500:]}
        dump = fr / f"{protocol.TIMEOUT_DUMP_PREFIX}0"
        if dump.exists():
            data = dump.read_bytes()
            (args.out / "nccl_timeout_rank0.pkl").write_bytes(data)
            rec = hang.parse_flight_record(data, hang.RankId("gpu0", 0, 0))
            seq, entry, state = rec.last(0)
            found.update(last_seq=seq, last_op=entry and entry.op, last_state=state)
        return found

    @check(results, out, "doctor_job", only)
    def _() -> dict:
        """doctor's job (orchestrator/node/doctor.py) on this machine's GPUs through
        torchrun, as `doctor` runs it on one node: NCCL all_reduce, bf16 matrix products
        per GPU, and nvidia-smi's health fields as doctor reads them (the raw lines are
        kept: they become the unit tests' recorded nvidia-smi output)."""
        from orchestrator.node import doctor as doctor_job
        from orchestrator.workloads import doctor_run as doctor

        out = subprocess.run(
            [str(Path(sys.executable).parent / "torchrun"), "--standalone",
             "--nproc-per-node", "gpu", doctor_job.__file__, "--addresses", "127.0.0.1"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env={**os.environ, "CLUSTERTRAIN_BACKEND": "nccl"})
        line = next((x for x in out.stdout.splitlines() if doctor_job.RESULT_MARK in x), None)
        if out.returncode != 0 or line is None:
            raise RuntimeError(f"exit {out.returncode}: {(out.stdout + out.stderr)[-1500:]}")
        result = json.loads(line.split(doctor_job.RESULT_MARK, 1)[1])
        report = doctor.analyse("gpu", result, ["gpu0"])
        return {"raw_nvidia_smi": result["gpus"].get("0"), "allreduce": result["allreduce"],
                "gflops": [r["gflops"] for r in result["ranks"]],
                "gpus": [vars(g) for g in report.nodes[0].gpus],
                "suspects": [vars(s) for s in report.suspects]}

    @check(results, out, "py_spy_under_yama", only)
    def _() -> dict:
        """kernel.yama.ptrace_scope=1 (Ubuntu's default on GPU servers), a non-root job
        user: py-spy run by that user from outside the worker's ancestry (as the
        supervisor's dump verb is) reads a worker started through the runner; a process
        started without it is the control. The sysctl is put back as it was."""
        yama = Path(node_dump.YAMA)
        if os.geteuid() != 0 or not yama.exists():
            return {"skipped": "needs root and a kernel with yama"}
        before = yama.read_text().strip()
        subprocess.run(["useradd", "-m", "ctjob"], capture_output=True)
        d = Path(tempfile.mkdtemp(prefix="yama-", dir="/tmp"))
        d.chmod(0o777)
        # the node package, installed by the job's user in a home of its own, as on a node
        subprocess.run(["runuser", "-u", "ctjob", "--", "env", f"HOME={d}", "bash", "-c",
                        nodelib.install_command()], check=True, text=True,
                       input=base64.b64encode(nodelib.bundle().tar_gz).decode())
        (d / "sleeper.py").write_text(
            "import os, sys, time\n"
            "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
            "def waiting_for_data():\n    time.sleep(120)\n"
            "waiting_for_data()\n")
        procs: list[subprocess.Popen] = []
        found: dict[str, object] = {"ptrace_scope_before": before}
        try:
            yama.write_text("1")
            for name, runner in (("with_runner", [nodelib.entry(str(d)), "worker"]),
                                 ("without_runner", [])):
                pidfile = d / f"{name}.pid"
                procs.append(subprocess.Popen(
                    ["runuser", "-u", "ctjob", "--", sys.executable, *runner,
                     str(d / "sleeper.py"), str(pidfile)], start_new_session=True))
                deadline = time.time() + 30
                while not pidfile.exists() or not pidfile.read_text():
                    assert time.time() < deadline, f"{name}: the sleeper did not start"
                    time.sleep(0.1)
                out = subprocess.run(["runuser", "-u", "ctjob", "--", args.py_spy, "dump",
                                      "--pid", pidfile.read_text()],
                                     capture_output=True, text=True, timeout=60)
                said = (out.stdout + out.stderr).strip()
                found[name] = {"exit": out.returncode, "read_its_stack": "waiting_for_data" in said,
                               "said": said[-400:], "hint": node_dump.ptrace_hint(said)}
        finally:
            yama.write_text(before)
            for p in procs:
                os.killpg(p.pid, 9)
                p.wait()
        return found

    @check(results, out, "nccl_mismatch_three_ranks", only)
    def _() -> dict:
        """Three NCCL ranks, a GPU each: rank 0 broadcasts where ranks 1 and 2
        all_reduce; all three wait in .item(). diagnose's own analysis of the node's dumps
        (py-spy stacks and flight recorders). NCCL refuses two ranks on one GPU
        ("ncclInvalidUsage: Duplicate GPU detected", NCCL 2.28.9, seen on an H100)."""
        import torch

        from orchestrator.diagnosis.dumps import NodeDumps, analyse
        from orchestrator.node.answers import DumpAnswer

        if torch.cuda.device_count() < 3:
            return {"skipped": f"needs 3 GPUs, this machine has "
                               f"{torch.cuda.device_count()}"}
        job, proc, _env = start_run(work, "gpu-mismatch", "mismatch", nproc=3)
        try:
            wait_for(job / "output.log", "in flight", 120, times=3)
            time.sleep(1.0)
            dumps = node_dump.dump_workers(str(job), "gpu-mismatch", args.py_spy, False)
        finally:
            node_stop.stop_tree(str(job), "gpu-mismatch", 5.0)
            proc.wait(timeout=60)
        ranks = DumpAnswer.from_json({"ranks": dumps}).ranks
        diagnosis = analyse([[NodeDumps("gpu0", ranks)]], args.out / "mismatch")
        return {"report": diagnosis.report(), "analysis": diagnosis.to_json(),
                "log_tail": (job / "output.log").read_text(errors="replace")[-2000:]}

    return 0 if all(v.get("ok") is not False for v in results.values()
                    if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
