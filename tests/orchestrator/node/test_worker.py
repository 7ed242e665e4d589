"""The worker runner (orchestrator/node/worker.py), run for real in a local Python process
from the node package as a node has it (`node.py worker`): a script behaves as it does
without the runner, and ends cleanly through it."""

from __future__ import annotations

import ast
import atexit
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.node import dump, protocol, worker as run_worker

from ..local_node import installed, unused_port

RUNNER = Path(run_worker.__file__)


@functools.cache
def node_py() -> Path:
    """node.py of the node package, installed under a home of these tests' own."""
    home = Path(tempfile.mkdtemp(prefix="clustertrain-home-"))
    atexit.register(shutil.rmtree, home, True)
    return installed(home)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def python(*argv: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env=env)


def runner(*argv: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return python(str(node_py()), "worker", *argv, cwd=cwd, env=env)


def marker(code: int, rank: int = 0) -> str:
    return f"[clustertrain] rank {rank} finished: exit code {code}"


def without_marker(stdout: str) -> str:
    lines = stdout.splitlines(keepends=True)
    assert lines and lines[-1].startswith("[clustertrain] rank "), stdout
    return "".join(lines[:-1])


def test_the_runner_needs_only_the_standard_library() -> None:
    # It runs in the nodes' Python, whatever is installed there.
    tree = ast.parse(RUNNER.read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree)
             if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert names - {"__future__"} <= set(sys.stdlib_module_names), names


SHOW = """\
    import json, sys
    import helper  # a module next to the script: sys.path[0] is the script's directory
    print(json.dumps({"argv": sys.argv, "file": __file__, "name": __name__,
                      "path0": sys.path[0], "helper": helper.WHERE,
                      "spec": __spec__ is None, "main": sys.modules["__main__"].__dict__
                      is globals(), "builtins": type(__builtins__).__name__}))
"""


def test_argv_file_name_and_imports_are_as_without_the_runner(tmp_path: Path) -> None:
    write(tmp_path / "proj" / "job.py", SHOW)
    write(tmp_path / "proj" / "helper.py", "WHERE = 'proj'\n")
    write(tmp_path / "helper.py", "WHERE = 'cwd'\n")  # must not shadow the script's own
    plain = python("proj/job.py", "--lr", "0.1", "a b", cwd=tmp_path)
    ours = runner("proj/job.py", "--lr", "0.1", "a b", cwd=tmp_path)
    assert plain.returncode == ours.returncode == 0, plain.stderr + ours.stderr
    got = json.loads(without_marker(ours.stdout))
    assert got == json.loads(plain.stdout)
    assert got["argv"] == ["proj/job.py", "--lr", "0.1", "a b"]
    assert got["file"] == str(tmp_path / "proj" / "job.py") and got["name"] == "__main__"
    assert got["helper"] == "proj" and got["main"]


MODULE = """\
    import json, sys
    from . import sibling                # a relative import inside the package
    print(json.dumps({"argv": sys.argv, "file": __file__, "name": __name__,
                      "spec": __spec__.name, "package": __package__,
                      "path0": sys.path[0], "sibling": sibling.X}))
"""


SPAWN = """\
    import multiprocessing as mp
    def square(x):                      # pickled by reference: __main__.square
        return x * x
    if __name__ == "__main__":
        with mp.get_context("spawn").Pool(1) as pool:   # the child imports this script
            print(pool.map(square, [3, 4]), flush=True)
"""


@pytest.mark.parametrize("as_module", [False, True])
def test_spawned_processes_find_the_scripts_functions(tmp_path: Path, as_module) -> None:
    # What torch.multiprocessing.spawn and spawn-context DataLoader workers need.
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "job.py", SPAWN)
    ours = runner(*(["-m", "pkg.job"] if as_module else ["pkg/job.py"]), cwd=tmp_path)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == f"[9, 16]\n{marker(0)}\n"


def test_a_module_runs_as_python_dash_m_runs_it(tmp_path: Path) -> None:
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "sibling.py", "X = 42\n")
    write(tmp_path / "pkg" / "mod.py", MODULE)
    plain = python("-m", "pkg.mod", "--epochs", "3", cwd=tmp_path)
    ours = runner("-m", "pkg.mod", "--epochs", "3", cwd=tmp_path)
    assert plain.returncode == ours.returncode == 0, plain.stderr + ours.stderr
    got = json.loads(without_marker(ours.stdout))
    assert got == json.loads(plain.stdout)
    assert got["argv"] == [str(tmp_path / "pkg" / "mod.py"), "--epochs", "3"]
    assert got["name"] == "__main__" and got["spec"] == "pkg.mod" and got["sibling"] == 42
    # A package's __main__, and a module that does not exist, as Python reports it.
    write(tmp_path / "pkg" / "__main__.py", "print('pkg main')\n")
    assert runner("-m", "pkg", cwd=tmp_path).stdout.splitlines() == ["pkg main", marker(0)]
    missing = runner("-m", "nosuch", cwd=tmp_path)
    assert missing.returncode == 1 and "No module named nosuch" in missing.stderr


@pytest.mark.parametrize("ending,code", [
    ("pass", 0), ("sys.exit(3)", 3), ("sys.exit(0)", 0), ("sys.exit(None)", 0),
    ("sys.exit(259)", 3), ("sys.exit(-1)", 255), ("raise SystemExit(True)", 1),
    ("sys.exit('fatal: no data')", 1),
])
def test_exit_codes_are_the_scripts_own(tmp_path: Path, ending: str, code: int) -> None:
    write(tmp_path / "job.py", f"import sys\nprint('working')\n{ending}\n")
    plain = python("job.py", cwd=tmp_path)
    ours = runner("job.py", cwd=tmp_path)
    assert plain.returncode == ours.returncode == code
    assert ours.stdout == f"working\n{marker(code)}\n"
    assert ours.stderr == plain.stderr  # 'fatal: no data' for a string, as Python prints it


def test_an_uncaught_exception_prints_its_traceback_and_exits_1(tmp_path: Path) -> None:
    write(tmp_path / "job.py", """\
        def step(n):
            raise ValueError(f"loss is nan at step {n}")
        print("training")
        step(7)
    """)
    plain = python("job.py", cwd=tmp_path)
    ours = runner("job.py", cwd=tmp_path)
    assert plain.returncode == ours.returncode == 1
    # The very same report: no frame of the runner in it.
    assert ours.stderr == plain.stderr
    assert ours.stderr.startswith("Traceback (most recent call last):\n  File ")
    assert "ValueError: loss is nan at step 7" in ours.stderr
    assert "node/worker.py" not in ours.stderr
    assert ours.stdout == f"training\n{marker(1)}\n"


def test_a_file_written_and_never_closed_is_on_disk(tmp_path: Path) -> None:
    write(tmp_path / "job.py", """\
        import sys
        log = open("metrics.txt", "w")          # text, never closed
        log.write("epoch 1 acc 0.91\\n")
        blob = open("weights.bin", "wb")        # binary, buffered, never closed
        blob.write(b"\\x01" * 1000)
        def keep():                             # reachable from a closure only
            f = open("closure.txt", "a")
            f.write("kept")
            return lambda: f
        holder = keep()
        class Touchy:                           # asked for anything, it complains
            def __getattribute__(self, name):
                sys.stderr.write(f"touched {name}\\n")
                raise RuntimeError(name)
        touchy = Touchy()
        sys.stdout = open("stdout.txt", "w")    # the script's own stdout, replaced
        print("to the file")
    """)
    ours = runner("job.py", cwd=tmp_path)
    assert ours.returncode == 0, ours.stderr
    assert ours.stderr == ""  # the search for open files touched no other object
    assert (tmp_path / "metrics.txt").read_text() == "epoch 1 acc 0.91\n"
    assert (tmp_path / "weights.bin").read_bytes() == b"\x01" * 1000
    assert (tmp_path / "closure.txt").read_text() == "kept"
    assert (tmp_path / "stdout.txt").read_text() == "to the file\n"
    # The marker still goes to the process's stdout (what torchrun reads).
    assert ours.stdout == marker(0) + "\n"


def test_threads_and_atexit_handlers_run_before_the_end(tmp_path: Path) -> None:
    write(tmp_path / "job.py", """\
        import atexit, threading, time
        atexit.register(lambda: print("atexit handler", flush=True))
        def upload():
            time.sleep(0.3)
            print("upload thread done", flush=True)
        threading.Thread(target=upload).start()   # not a daemon: Python waits for it
        print("script done", flush=True)
    """)
    ours = runner("job.py", cwd=tmp_path, env={"PATH": "/usr/bin", "RANK": "5"})
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.splitlines() == ["script done", "upload thread done", "atexit handler",
                                        marker(0, rank=5)]


def test_an_abort_in_the_interpreters_teardown_cannot_fail_a_finished_script(
        tmp_path: Path) -> None:
    # Test double for gloo's threads: an object that aborts the process when the
    # interpreter finalizes it, after the script's work is done.
    write(tmp_path / "job.py", """\
        import os
        class GlooLike:
            def __del__(self):
                os.abort()
        pg = GlooLike()
        print("final accuracy 0.93", flush=True)
    """)
    plain = python("job.py", cwd=tmp_path)
    assert plain.returncode == -signal.SIGABRT, "the test double did not abort"
    ours = runner("job.py", cwd=tmp_path)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == f"final accuracy 0.93\n{marker(0)}\n"


def test_ctrl_c_ends_by_sigint_as_python_does(tmp_path: Path) -> None:
    write(tmp_path / "job.py", "print('step 1', flush=True)\nraise KeyboardInterrupt\n")
    plain = python("job.py", cwd=tmp_path)
    ours = runner("job.py", cwd=tmp_path)
    assert plain.returncode == ours.returncode == -signal.SIGINT
    assert ours.stderr == plain.stderr and "KeyboardInterrupt" in ours.stderr
    assert "finished" not in ours.stdout  # an interrupted script did not finish


def test_a_missing_script_is_reported_as_python_reports_it(tmp_path: Path) -> None:
    plain = python("nosuch.py", cwd=tmp_path)
    ours = runner("nosuch.py", cwd=tmp_path)
    assert plain.returncode == ours.returncode == 2
    assert ours.stderr == plain.stderr and "can't open file" in ours.stderr
    usage = runner(cwd=tmp_path)
    assert usage.returncode == 2 and "usage: node.py worker SCRIPT" in usage.stderr


# --- the flight recorder on request ---------------------------------------------------

FR_JOB = """
    import os, sys, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for _ in range(2):
        dist.all_reduce(t)
    print("entering", flush=True)
    if dist.get_rank() == 1:
        time.sleep(120)  # held up outside any collective
    dist.all_reduce(t)   # rank 0 waits here for rank 1
"""


def test_a_rank_blocked_in_a_collective_answers_with_its_flight_recorder(
        tmp_path: Path) -> None:
    """Two real gloo ranks through the runner: rank 0 waits in all_reduce #3 for rank 1,
    which never gets there. Asked the way the supervisor asks (supervisor.py's request
    and collect), both answer with torch's own dump, and the analysis names rank 1."""
    import base64
    import zlib

    from orchestrator.diagnosis.hang import RankId, analyze_flight_records, parse_flight_record

    pytest.importorskip("torch")
    script = write(tmp_path / "job.py", FR_JOB)
    job = tmp_path / "job"
    port = str(unused_port())
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               run_worker.FR_DIR_ENV: str(job / protocol.FR_SUBDIR)}
        procs.append(subprocess.Popen([sys.executable, str(node_py()), "worker", str(script)],
                                      cwd=tmp_path,
                                      env=env, stdout=subprocess.PIPE, text=True))
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "entering"
        time.sleep(1.0)  # rank 0 is inside its third all_reduce by now
        token = "0a1b2c"
        assert dump.request_flight_records(str(job), [0, 1], token) == {}
        # Three times the supervisor's wait: what is tested is the answer, not its speed
        # (on two cores shared with lint and the provisioning, one took over 10 s).
        deadline = time.monotonic() + 3 * dump.FR_TIMEOUT
        answers = {r: dump.collect_flight_record(str(job), r, token, deadline)
                   for r in (0, 1)}
        assert procs[0].poll() is None  # still waiting: the dump did not disturb it
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert all("fr" in a for a in answers.values()), {
        r: a.get("fr_error") for r, a in answers.items()}
    records = [parse_flight_record(zlib.decompress(base64.b64decode(answers[r]["fr"])),
                                   RankId(f"node{r}", r, procs[r].pid)) for r in (0, 1)]
    assert [rec.last(0)[0] for rec in records] == [3, 2]
    last = records[0].last(0)[1]
    assert last is not None and last.op == "all_reduce"
    analysis = analyze_flight_records(records)
    assert [(s.node, s.rank) for s in analysis.suspects] == [("node1", 1)]


def test_a_worker_without_the_runner_is_said_to_serve_no_flight_recorder(
        tmp_path: Path) -> None:

    assert "serves no flight recorder" in dump.request_flight_records(
        str(tmp_path), [0], "abc")[0]


def test_the_job_user_may_read_the_workers_stack_where_yama_would_forbid_it() -> None:
    """PR_SET_PTRACER_ANY succeeds exactly where the kernel has yama (the rule it lifts);
    run for real on this machine's kernel."""

    assert run_worker.allow_same_user_tracers() == os.path.exists(dump.YAMA)
