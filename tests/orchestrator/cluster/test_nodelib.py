"""The node package (orchestrator/node/) and how it reaches the nodes (cluster/nodelib.py):
standard library only, one directory per version under the user's home, copied once; no
program travels as a string or on a command line. The nodes are this machine (bash with a
home of the test's own): the sandbox tests reach real nodes the same way."""

from __future__ import annotations

import ast
import json
import os
import shlex
import sys
import threading
from pathlib import Path
from typing import TypeVar

import pytest

from orchestrator.cluster import nodelib
from orchestrator.cluster.ssh import Result
from orchestrator.node import requests as rq, role_module_files
from orchestrator.node.answers import (
    Busy,
    CarryAnswer,
    DuAnswer,
    EnvsAnswer,
    HealthAnswer,
    LiveRun,
    StatesAnswer,
    UsageAnswer,
)
from orchestrator.run.command import NodeCommand

from ..local_node import Canned, LocalNode

A = TypeVar("A")

NODE = Path(nodelib.__file__).resolve().parents[1] / "node"
ORCHESTRATOR = NODE.parent
REPO = ORCHESTRATOR.parent
# What runs in the job's environment rather than the node's bare Python imports torch when
# it runs: the doctor's measurements, the torch check of the fingerprint, and torchrun.
TORCH_WHEN_RUN = {"doctor.py", "fingerprint.py", "torchrun.py"}


def imports(tree: ast.AST, top_level: bool) -> set[str]:
    """The modules TREE imports (absolute names; relative ones as '.'): those it imports
    when it is loaded (TOP_LEVEL: not inside a function), or those inside its functions."""
    def walk(node: ast.AST, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                      ast.Lambda))
            yield child, inner
            yield from walk(child, inner)

    found = set()
    for n, in_function in walk(tree, False):
        if in_function == top_level:
            continue
        if isinstance(n, ast.Import):
            found |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            found.add("." if n.level else n.module or "")
    return found


# The package's own files and the roles' files that are modules of it.
MODULES = sorted([*NODE.glob("*.py"), *map(Path, role_module_files().values())])


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_a_node_module_imports_the_standard_library_and_the_package_only(path: Path) -> None:
    tree = ast.parse(path.read_text())
    ours = {".", "orchestrator.node"} | {n for n in imports(tree, True) | imports(tree, False)
                                         if n.startswith("orchestrator.node.")}
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    top = {n for n in imports(tree, True) if n not in ours and n.split(".")[0] not in stdlib}
    assert top == set(), f"{path.name} imports {top} when it is loaded"
    inside = {n for n in imports(tree, False) if n not in ours and n.split(".")[0] not in stdlib}
    allowed = {"torch"} if path.name in TORCH_WHEN_RUN else set()
    assert {n.split(".")[0] for n in inside} <= allowed, f"{path.name} imports {inside}"


def test_no_controller_module_reads_a_node_program_to_send_it() -> None:
    """The node package travels as files, once (nodelib); nothing else reads a node
    module's source, as the programs once were sent: by their source on a command line."""
    readers = []
    for path in ORCHESTRATOR.rglob("*.py"):
        if path.parent == NODE or path.name == "nodelib.py":
            continue
        text = path.read_text()
        if ".__file__).read" in text or "exec(compile(" in text:
            readers.append(str(path.relative_to(ORCHESTRATOR)))
    assert readers == []


def command(**kw) -> NodeCommand:
    base = dict(run_id="r1", node_rank=0, nnodes=2, nproc=1, master_addr="10.0.0.1",
                master_port=29500, torchrun="/opt/env/bin/torchrun", home="/home/alice",
                script="train.py", node="n0", nodes=("n0", "n1"), run_state="/mnt/s/r1")
    return NodeCommand(**{**base, **kw})


@pytest.mark.parametrize("line", [
    command().shell(), command().follow(lease=True),
    nodelib.command("/usr/bin/python3", rq.Stop(".clustertrain/jobs", "r1", 5.0)),
    nodelib.command("/usr/bin/python3", rq.Probe()), nodelib.install_command()],
    ids=["launch", "follow", "stop", "probe", "install"])
def test_no_program_travels_on_a_command_line(line: str) -> None:
    assert " -c " not in line.replace("sh -c ", "") and "exec(" not in line
    assert len(line) < 3000, len(line)   # the supervisor's source was 35 KB of it


def test_the_node_package_is_copied_once_per_version(tmp_path: Path) -> None:
    """The first call finds no copy (exit MISSING), copies this version and runs; a second
    call, or a second launch of the same version, copies nothing."""
    node = LocalNode(tmp_path)
    state = tmp_path / "share"
    state.mkdir()
    first = nodelib.call(node, sys.executable, rq.States(str(state)))
    assert first.exit_code == 0 and '"states": {}' in first.stdout, first.stderr
    assert len(node.runs) == 3 and node.runs[1] == nodelib.install_command(sys.executable)
    lib = Path(nodelib.lib_dir(str(tmp_path)))
    # compiled as it was copied, also what this call did not import: the first launch
    # after an upgrade compiles nothing on the nodes
    assert list((lib / "orchestrator/node/__pycache__").glob("supervise.*.pyc"))
    before = {p: p.stat().st_mtime_ns for p in lib.rglob("*.py")}
    assert (lib / "node.py").is_file() and (lib / "orchestrator/node/supervise.py").is_file()
    assert oct((tmp_path / ".clustertrain").stat().st_mode & 0o777) == "0o700"
    node.runs.clear()
    again = nodelib.call(node, sys.executable, rq.States(str(state)))
    assert again.exit_code == 0 and node.runs == [nodelib.command(sys.executable,
                                                                  rq.States(str(state)))]
    assert {p: p.stat().st_mtime_ns for p in lib.rglob("*.py") if p in before} == before
    assert [p.name for p in lib.parent.iterdir()] == [lib.name]   # one version, no leftovers


def test_two_first_calls_at_once_leave_one_copy(tmp_path: Path) -> None:
    """Two launches of a new version on one node (two users' runs, or two runs at once):
    each unpacks into a directory of its own and the second finds the first in place."""
    done: list[bool] = []

    def one() -> None:
        nodelib.install(LocalNode(tmp_path))
        done.append(True)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lib = Path(nodelib.lib_dir(str(tmp_path)))
    assert len(done) == 4 and [p.name for p in lib.parent.iterdir()] == [lib.name]
    assert (lib / "node.py").is_file()


def test_the_version_is_the_content(monkeypatch: pytest.MonkeyPatch) -> None:
    first = nodelib.bundle()
    nodelib.bundle.cache_clear()
    assert nodelib.bundle() == first   # the same files: the same version and bytes
    files = nodelib._files()
    changed = [(name, data + b"\n# changed\n" if name.endswith("supervise.py") else data)
               for name, data in files]
    monkeypatch.setattr(nodelib, "_files", lambda: changed)
    nodelib.bundle.cache_clear()
    try:
        assert nodelib.bundle().version != first.version
    finally:
        monkeypatch.undo()
        nodelib.bundle.cache_clear()


def test_the_node_package_runs_from_its_copy_alone(tmp_path: Path) -> None:
    """The copy on a node needs nothing of the controller's package: run with a Python
    that sees only the copy (no site-packages, another working directory)."""
    node = LocalNode(tmp_path)
    nodelib.install(node)
    entry = nodelib.entry(str(tmp_path))
    result = node.run(f"cd / && {shlex.quote(sys.executable)} -S -E -s {shlex.quote(entry)} "
                      f"states {shlex.quote(str(tmp_path))}")
    assert result.exit_code == 0 and '"states"' in result.stdout, result.stderr
    assert os.path.isdir(Path(entry).parent / "orchestrator" / "node" / "__pycache__")


def test_a_verbs_request_and_answer_round_trip_through_the_node_program(tmp_path: Path) -> None:
    """The request goes on standard input, the answer comes back as the JSON object on the
    last line: a cordon written through one call is listed by the next."""
    share = tmp_path / "share"
    (share / "cordons").mkdir(parents=True)
    node = LocalNode(tmp_path / "home")
    said = nodelib.ask(node, sys.executable, rq.Cordon(), node="n0", stdin=json.dumps(
        {"share": str(share), "node": "n1", "action": "cordon", "why": "bad GPU"}))
    assert said.event is not None
    assert said.event["node"] == "n1" and said.event["why"] == "bad GPU"
    listed = nodelib.ask(node, sys.executable, rq.Cordon(), node="n0",
                         stdin=json.dumps({"share": str(share)}))
    assert list(listed.cordoned) == ["n1"]


@pytest.mark.parametrize(("result", "said"), [
    (Result(0, "starting\nnot json at all\n", ""), "its answer was not JSON: not json at all"),
    (Result(0, '{"states": {"r1": 1}, "now": 12', ""),
     'its answer was cut short: {"states": {"r1": 1}, "now": 12'),
    (Result(0, '{"why": "unterminated', ""), 'its answer was cut short: {"why": "unterminated'),
    (Result(0, "", ""), "it gave no answer"),
    (Result(0, " \n\n", "a warning\n"), "it gave no answer"),
    (Result(0, "[1, 2]\n", ""), "its answer was not a JSON object: [1, 2]"),
    (Result(0, "x" * 500, ""), "its answer was not JSON: " + "x" * 200),
    (Result(1, '{"states": {}}', "Traceback ...\nPermissionError: [Errno 13] /s\n"),
     "PermissionError: [Errno 13] /s"),
    (Result(137, "", ""), "exit 137"),
], ids=["not-json", "cut-short", "cut-in-a-string", "empty", "blank", "not-an-object",
        "long", "stderr", "exit"])
def test_an_answer_that_is_not_one_is_a_typed_error_naming_node_verb_and_what_it_said(
        result: Result, said: str) -> None:
    with pytest.raises(nodelib.NodeAnswerError) as caught:
        nodelib.ask(Canned(result), "/usr/bin/python3", rq.States("/s"), node="node7")
    error = caught.value
    assert isinstance(error, RuntimeError)   # what callers caught before
    assert (error.node, error.verb, error.said, error.exit_code) == (
        "node7", "states", said, result.exit_code)
    assert str(error).startswith("node7: ") and "states" in str(error) and said in str(error)


def test_the_real_node_programs_answers_are_read_as_their_requests_declare_them(
        tmp_path: Path) -> None:
    """The node and the controller read one declaration (node/answers.py): what the node
    program prints is read back by `ask` as its request's ANSWER, attributes and all."""
    share, home = tmp_path / "share", tmp_path / "home"
    (share / "data").mkdir(parents=True)
    (share / "data" / "x.bin").write_bytes(b"\0" * 8192)
    (share / "state" / "hang").mkdir(parents=True)
    (share / "state" / "n0.json").write_text(json.dumps({"state": "running", "time": 1.0}))
    node = LocalNode(home)

    def ask(request: rq.Request[A]) -> A:
        return nodelib.ask(node, sys.executable, request, node="n0")

    states = ask(rq.States(str(share / "state")))
    assert isinstance(states, StatesAnswer) and states.states == {
        "n0": {"state": "running", "time": 1.0}} and states.hang == {} and states.next is None
    du = ask(rq.Du(str(share)))
    assert isinstance(du, DuAnswer) and du.share == str(share.resolve()) and du.unread == []
    assert [kinds["data"] >= 8192 for kinds in du.users.values()] == [True]
    usage = ask(rq.Usage(str(share)))
    assert isinstance(usage, UsageAnswer) and (usage.runs, usage.users, usage.slurm) == (
        [], {}, None)
    envs = ask(rq.Envs())
    assert isinstance(envs, EnvsAnswer) and envs.envs == [] and envs.root == str(
        home / ".clustertrain" / "envs")
    busy = ask(rq.Busy(exclude="none-such"))
    assert isinstance(busy, Busy) and all(isinstance(r, LiveRun) for r in busy.runs)
    health = ask(rq.Health())
    assert isinstance(health, HealthAnswer) and health.history == {}


def test_carry_is_read_as_its_answer(tmp_path: Path) -> None:
    """sync.py reads `carry`'s output (run with the reuse or the seal in one round trip) as
    the request's answer."""
    code = tmp_path / "home" / "code"
    (code / "r1").mkdir(parents=True)
    (code / "r1" / "train.py").write_text("print(1)\n")
    node = LocalNode(tmp_path / "home")
    request = rq.Carry(str(code), "r1", "work")
    result = nodelib.call(node, sys.executable, request)
    assert nodelib.answer_to(result, "n0", request) == CarryAnswer(None, [], [], False)


@pytest.mark.parametrize(("request_", "out", "field", "said"), [
    (rq.States("/s"), '{"states": {}}', "now", "its answer's now is missing"),
    (rq.States("/s"), '{"states": {}, "now": "soon"}', "now",
     "its answer's now is a string ('soon'), not float"),
    (rq.Stop("jobs", "r1", 5.0), '{"found": true, "user": "a", "killed": ["x"], "left": []}',
     "killed[0]", "its answer's killed[0] is a string ('x'), not int"),
    (rq.Dump("jobs", "r1", "py-spy"), '{"ranks": [{"rank": 0}]}', "ranks[0].pid",
     "its answer's ranks[0].pid is missing"),
], ids=["missing", "wrong-kind", "in-a-list", "nested"])
def test_an_answer_of_the_wrong_shape_is_a_typed_error_naming_node_verb_and_field(
        request_: rq.Request, out: str, field: str, said: str) -> None:
    with pytest.raises(nodelib.NodeAnswerError) as caught:
        nodelib.ask(Canned(Result(0, out + "\n", "")), "/usr/bin/python3", request_,
                    node="node7")
    error = caught.value
    assert (error.node, error.verb, error.field, error.said) == (
        "node7", request_.VERB, field, said)
    assert str(error) == f"node7: `node.py {request_.VERB}` failed: {said}"


def test_the_roles_files_are_modules_of_the_package_with_no_link_in_it() -> None:
    """health.py, cordon.py, untrusted.py and fingerprint.py are the roles' files, the one
    copy: imported from there on the controller, carried by the bundle into the package on
    the nodes; no link under orchestrator/ stands for them (or anything else)."""
    from orchestrator import node, resources
    from orchestrator.node import cordon, fingerprint, health, untrusted

    links = [p for p in ORCHESTRATOR.rglob("*") if p.is_symlink()]
    assert links == [], links
    roles = REPO / "roles"
    assert {m.__name__: Path(m.__file__ or "") for m in (health, cordon, untrusted, fingerprint)
            } == {"orchestrator.node.health": roles / "health/files/health.py",
                  "orchestrator.node.cordon": roles / "slurm/files/cordon.py",
                  "orchestrator.node.untrusted": roles / "slurm/files/untrusted.py",
                  "orchestrator.node.fingerprint": roles / "python_env/files/fingerprint.py"}
    carried = dict(nodelib._files())
    for name, path in role_module_files().items():
        assert carried[f"orchestrator/node/{name}.py"] == Path(path).read_bytes()
    # The wheel's copy of the roles is where the package looks for them in an install.
    assert node._ROLES[1] == (os.pardir, resources.SHIPPED_DIR, "roles")
