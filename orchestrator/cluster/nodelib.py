"""The node package on the nodes: orchestrator/node/ reaches each node once per version,
as ~/.clustertrain/lib/<version>/ of the user who runs it there (node.py beside the
package), and is called by verb: `python3 ~/.clustertrain/lib/<version>/node.py VERB`.

The version is a digest of the package's files, so a node that has it gets nothing more:
a call runs the node's copy, and only a node that lacks it (exit code MISSING) gets the
files, once, through the same connection, then the call again. No program travels as a
string or on a command line; Python keeps its bytecode cache beside the files.

A verb answers with one JSON object, the last line of its output, declared by its request's
ANSWER (node/answers.py): `ask` returns it as that dataclass, or raises NodeAnswerError
naming the node, the verb and what the node said instead (or the field of its answer that
is missing or of the wrong kind).
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import io
import json
import shlex
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..node import ROLE_MODULES, protocol, role_module_files
from ..node.answers import AnswerError
from ..node.requests import Request

A = TypeVar("A")

PACKAGE = Path(__file__).resolve().parents[1]     # orchestrator/
ENTRY = "node.py"
MISSING = 67   # a call's exit code when the node lacks this version
SHOWN = 200    # characters of an answer that is not one, shown in the error


class Runs(Protocol):
    """What nodelib needs of a connection (ssh.Connection, or a stand-in in tests)."""

    def run(self, command: str, timeout: float = 60.0, stdin: str | None = None):  # noqa: ANN201
        ...


class Starts(Runs, Protocol):
    """A connection that also starts a command and streams its output (ssh.Connection)."""

    def popen(self, command: str, stdin: bool = False) -> subprocess.Popen:
        ...


class Output(Protocol):
    """What a command's result holds (ssh.Result, or a stand-in's)."""

    @property
    def exit_code(self) -> int: ...

    @property
    def stdout(self) -> str: ...

    @property
    def stderr(self) -> str: ...


class NodeAnswerError(RuntimeError):
    """A node verb gave no answer to read: it failed (SAID: the last line of its stderr, or
    "exit N"), the last line of its output is no JSON object, or that object is not the
    verb's answer (FIELD: the one missing or of the wrong kind). A RuntimeError, as what
    the callers caught before it had a type of its own."""

    def __init__(self, node: str, verb: str, said: str, exit_code: int,
                 field: str | None = None) -> None:
        super().__init__(f"{node}: `node.py {verb}` failed: {said}")
        self.node = node
        self.verb = verb
        self.said = said
        self.exit_code = exit_code
        self.field = field


@dataclass(frozen=True)
class Bundle:
    version: str
    tar_gz: bytes


def _files() -> list[tuple[str, bytes]]:
    """The bundle's files, by their path under the lib directory: the package with the
    roles' files that are modules of it (node/__init__.py: ROLE_MODULES), its parent's
    __init__ and node.py."""
    node = PACKAGE / "node"
    modules = {p.name: p for p in node.glob("*.py") if p.name != "entry.py"}
    roles = role_module_files()
    if len(roles) != len(ROLE_MODULES):
        raise RuntimeError(f"the roles' files {', '.join(f'{m}.py' for m in ROLE_MODULES)} "
                           f"are not beside {PACKAGE}: reinstall clustertrain")
    modules.update({f"{name}.py": Path(path) for name, path in roles.items()})
    files = [(f"orchestrator/node/{name}", modules[name].read_bytes())
             for name in sorted(modules)]
    return [("orchestrator/__init__.py", (PACKAGE / "__init__.py").read_bytes()),
            *files, (ENTRY, (node / "entry.py").read_bytes())]


@functools.cache
def bundle() -> Bundle:
    """This version of the node package: its digest and a reproducible tar.gz of it."""
    files = _files()
    digest = hashlib.sha256()
    for name, data in files:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, 0
            tar.addfile(info, io.BytesIO(data))
    return Bundle(digest.hexdigest()[:16], gzip.compress(raw.getvalue(), mtime=0))


def lib_dir(home: str = '"$HOME"') -> str:
    """This version's directory on a node, under HOME (a path, or the shell's $HOME)."""
    return f"{home}/{protocol.NODE_STATE_DIR}/{protocol.LIB_SUBDIR}/{bundle().version}"


def entry(home: str) -> str:
    """node.py of this version under HOME (the job user's home on a node)."""
    return f"{lib_dir(home)}/{ENTRY}"


def command(python: str, request: Request, sudo: bool = False) -> str:
    """A shell command that runs REQUEST's verb with the node's PYTHON (as root through
    `sudo -n` with SUDO: an admin's call), or exits MISSING when the node lacks this
    version."""
    script = (f'e={lib_dir()}/{ENTRY}; [ -f "$e" ] || exit {MISSING}; '
              f'exec {"sudo -n " if sudo else ""}{shlex.quote(python)} "$e" '
              f'{shlex.join([request.VERB, *request.argv()])}')
    return f"sh -c {shlex.quote(script)}"


def install_command(python: str | None = None) -> str:
    """A shell command that unpacks this version from standard input (base64 of the
    tar.gz) into a private directory of its own and moves it into place; one that is
    there already (another launch was faster) is kept. With PYTHON, its bytecode is
    compiled there first: the first launch after an upgrade does not compile the package
    on every node at once."""
    v = bundle().version
    compile_ = (f'{{ {shlex.quote(python)} -m compileall -q "$t" >/dev/null 2>&1 || :; }} && '
                if python else "")
    script = (f'umask 077; d="$HOME"/{protocol.NODE_STATE_DIR}/{protocol.LIB_SUBDIR}; '
              f'mkdir -p "$d" && t=$(mktemp -d "$d/.{v}.XXXXXX") && '
              f'base64 -d | tar -xzf - -C "$t" && {compile_}'
              f'{{ mv -T "$t" "$d/{v}" 2>/dev/null || rm -rf "$t"; }}')
    return f"sh -c {shlex.quote(script)}"


def install(conn: Runs, python: str | None = None) -> None:
    """Copy this version to the node behind CONN, compiled for PYTHON if given
    (RuntimeError with the node's words)."""
    result = conn.run(install_command(python), timeout=120,
                      stdin=base64.b64encode(bundle().tar_gz).decode())
    if result.exit_code != 0:
        said = result.stderr.strip().splitlines() or [f"exit {result.exit_code}"]
        raise RuntimeError(f"could not install clustertrain's node package under "
                           f"~/{protocol.NODE_STATE_DIR}/{protocol.LIB_SUBDIR}: {said[-1]}")


def call(conn: Runs, python: str, request: Request, timeout: float = 60.0,
         stdin: str | None = None, sudo: bool = False):  # noqa: ANN201 - the connection's Result
    """Run REQUEST on the node with its PYTHON (as root with SUDO); the package is copied
    first if it lacks it."""
    result = conn.run(command(python, request, sudo=sudo), timeout=timeout, stdin=stdin)
    if result.exit_code == MISSING:
        install(conn, python)
        result = conn.run(command(python, request, sudo=sudo), timeout=timeout, stdin=stdin)
    return result


def _answer_json(result: Output, node: str, verb: str) -> dict[str, Any]:
    """The answer in RESULT, VERB's run on NODE: the JSON object on its output's last line,
    as JSON holds it (NodeAnswerError when it failed or gave none); `answer_to` reads it
    as its request declares it."""
    def no_answer(said: str) -> NodeAnswerError:
        return NodeAnswerError(node, verb, said, result.exit_code)

    if result.exit_code != 0:
        raise no_answer((result.stderr.strip().splitlines() or
                         [f"exit {result.exit_code}"])[-1])
    lines = result.stdout.strip().splitlines()
    if not lines:
        raise no_answer("it gave no answer")
    last = lines[-1].strip()
    try:
        answer = json.loads(last)
    except json.JSONDecodeError as exc:
        # The parser ran out of text (or inside a string): the output ended early (the
        # node died mid-print, the connection dropped), not a line of something else.
        cut = exc.pos >= len(last) or exc.msg.startswith("Unterminated string")
        raise no_answer(f"its answer was {'cut short' if cut else 'not JSON'}: "
                        f"{last[:SHOWN]}") from None
    if not isinstance(answer, dict):
        raise no_answer(f"its answer was not a JSON object: {last[:SHOWN]}")
    return answer


def answer_to(result: Output, node: str, request: Request[A]) -> A:
    """REQUEST's answer in RESULT, its run on NODE, as its ANSWER declares it
    (NodeAnswerError when it failed, gave none, or its answer is not of that shape)."""
    data = _answer_json(result, node, request.VERB)
    try:
        return request.read_answer(data)
    except AnswerError as exc:
        raise NodeAnswerError(node, request.VERB, f"its answer's {exc}", result.exit_code,
                              exc.field) from None


def ask(conn: Runs, python: str, request: Request[A], *, node: str, timeout: float = 60.0,
        stdin: str | None = None, sudo: bool = False) -> A:
    """REQUEST's answer on NODE (CONN to it) as `call` runs it; NodeAnswerError when the
    verb failed, gave none, or not its answer (the connection's own errors pass through)."""
    return answer_to(call(conn, python, request, timeout=timeout, stdin=stdin, sudo=sudo),
                     node, request)
