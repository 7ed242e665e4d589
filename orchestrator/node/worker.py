"""Run one training worker to a clean end: `python node.py worker SCRIPT ARGS...` or
`python node.py worker -m MODULE ARGS...`, as torchrun starts it on every node.

The script runs as it would without this runner: `sys.argv`, `__file__`, `__name__ ==
"__main__"`, `sys.path[0]` (the script's directory, or the working directory with -m) and
the exit code are the same. What differs is the end. When the script returns, calls
sys.exit() or raises, the runner does what the interpreter does before it finalizes
(joins non-daemon threads, runs the atexit handlers), flushes every open file object and
stdio, prints one marker line

    [clustertrain] rank R finished: exit code C

and leaves with os._exit(C), skipping the interpreter's and C++'s static teardown. With
gloo, torch's threads at that point now and then abort a finished process (SIGABRT,
"terminate called without an active exception"), turning a finished run into a failed
one. The orchestrator reads the marker (orchestrator/record/ends.py): a rank that printed
it and still died, died after its script had finished.

The runner lets the job's user read the worker's stack (py-spy) where yama's
ptrace_scope=1 would allow only its ancestors (allow_same_user_tracers).

A script that trains with DistributedDataParallel gets its step times measured, without a
change to it (steptime.py): beats like those a script may print, from DDP's own timers.

With CLUSTERTRAIN_FR_DIR set (the launch sets it), the runner also answers requests for
the rank's PyTorch flight recorder (`diagnose`, a hang): a daemon thread reads tokens from
the named pipe DIR/rank{R}.pipe and, for each, writes torch's own dump of the recorder
(pickled, as torch writes it on a NCCL timeout) to DIR/rank{R}-{token}.pkl. It works
while the script's thread is blocked inside a collective, which releases the GIL.

Standard library only: it runs in the job's Python, whatever is installed there, from
this package's directory on the node (~/.clustertrain/lib/<version>/).
"""

from __future__ import annotations

import atexit
import builtins
import gc
import io
import os
import signal
import sys
import threading
import types
import warnings

from . import steptime
from .protocol import FINISHED_MARKER, FR_DIR_ENV
from .util import write_atomically

MARKER = FINISHED_MARKER
PR_SET_PTRACER = 0x59616D61          # prctl: who may ptrace this process (yama)
PR_SET_PTRACER_ANY = (1 << 64) - 1   # ... any process, under the usual same-user rule
TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
INTERRUPTED = -1  # run()'s answer for an uncaught KeyboardInterrupt
USAGE = "usage: node.py worker SCRIPT [ARGS...] | node.py worker -m MODULE [ARGS...]"


def exit_code(code: object) -> int:
    """The process exit status Python gives `raise SystemExit(code)` (stderr text aside)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def _runner_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback without this runner's own frames in front, as Python would show it."""
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def _fresh_main() -> types.ModuleType:
    """A new, empty __main__ module, as the interpreter makes one for a script."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    return main


def _run_script(path: str) -> None:
    from importlib.machinery import SourceFileLoader

    main = _fresh_main()
    full = os.path.abspath(path)
    main.__dict__.update(__file__=full, __cached__=None, __spec__=None, __package__=None,
                         __loader__=SourceFileLoader("__main__", full))
    try:
        with io.open_code(full) as f:
            source = f.read()
    except OSError as exc:  # Python's own words and status for a script it cannot open
        print(f"{sys.executable}: can't open file {full!r}: [Errno {exc.errno}] "
              f"{exc.strerror}", file=sys.stderr)
        raise SystemExit(2) from None
    code = compile(source, full, "exec", dont_inherit=True)
    exec(code, main.__dict__)  # noqa: S102 - running the user's script is the point


def _run_module(name: str) -> None:
    import runpy

    _fresh_main()
    # What `python -m NAME` runs: the module's code in __main__, sys.argv[0] its file.
    runpy._run_module_as_main(name, alter_argv=True)  # type: ignore[attr-defined]


def flight_record() -> bytes:
    """This process's flight recorder as torch dumps it (a pickled dict): the NCCL
    recorder when the default group is NCCL's, else the one gloo records into. Empty when
    the script never imported torch or its torch has no recorder."""
    torch = sys.modules.get("torch")
    if torch is None:
        return b""
    c10d = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    dist = getattr(torch, "distributed", None)
    nccl = False
    try:
        nccl = bool(dist and dist.is_initialized() and dist.get_backend() == "nccl")
    except Exception:  # noqa: BLE001 - a group torn down meanwhile: the generic recorder
        pass
    for name in (["_dump_nccl_trace"] if nccl else []) + ["_dump_fr_trace"]:
        dump = getattr(c10d, name, None)
        if dump is not None:
            return bytes(dump())
    return b""


def serve_flight_records(directory: str, rank: str) -> None:
    """Answer every token written into DIR/rank{R}.pipe with DIR/rank{R}-{token}.pkl.
    The pipe is held open for writing here too, so a request never finds it without a
    reader while this process lives, and reads never see end-of-file."""
    pipe = os.path.join(directory, f"rank{rank}.pipe")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if os.path.exists(pipe):  # a worker restarted by torchrun: its predecessor's
            os.unlink(pipe)
        os.mkfifo(pipe, 0o600)
        requests = os.fdopen(os.open(pipe, os.O_RDWR), "rb", buffering=0)
    except OSError as exc:
        print(f"[clustertrain] rank {rank}: no flight-recorder dumps on request: {exc}",
              file=sys.stderr, flush=True)
        return
    for line in requests:
        token = line.strip().decode("ascii", "replace")
        if not token or not set(token) <= TOKEN_CHARS:
            continue
        try:
            data = flight_record()
        except Exception as exc:  # noqa: BLE001 - say why in the answer, go on serving
            data = f"error: {type(exc).__name__}: {exc}".encode()
        try:
            write_atomically(os.path.join(directory, f"rank{rank}-{token}.pkl"), data)
        except OSError:
            pass


def _start_flight_record_server() -> None:
    directory = os.environ.get(FR_DIR_ENV)
    if directory:
        threading.Thread(target=serve_flight_records, name="clustertrain-flight-recorder",
                         args=(directory, os.environ.get("RANK", "0")), daemon=True).start()


def allow_same_user_tracers() -> bool:
    """Let py-spy, run by the job's own user from the supervisor's `dump` verb, read this
    worker. Under yama's ptrace_scope=1 (Ubuntu's default) only a process's ancestors may
    ptrace it, and the dump verb is not one; this lifts that rule for this process only,
    and the kernel's own rule (same user, or CAP_SYS_PTRACE) still applies. False where
    it could not be set: a kernel without yama has no such rule to lift."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(PR_SET_PTRACER_ANY), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _is_file_type(cls: type) -> bool:
    try:
        return issubclass(cls, io.IOBase)
    except Exception:  # noqa: BLE001 - an odd metaclass
        return False


def _flush_open_files() -> None:
    """Flush every open file object the way finalization would have closed them: text
    layers first (they write into their buffers), then buffers, then raw files."""
    with warnings.catch_warnings():
        # By type, not isinstance(): that asks the object for __class__, and some objects
        # answer with a warning (torch.distributed.reduce_op) or worse.
        warnings.simplefilter("ignore")
        files = [o for o in gc.get_objects() if _is_file_type(type(o))]
    for kind in (io.TextIOBase, io.BufferedIOBase, io.RawIOBase, io.IOBase):
        for f in files:
            if not issubclass(type(f), kind):
                continue
            try:
                if not f.closed:
                    f.flush()
            except Exception:  # noqa: BLE001 - a broken file must not keep the others back
                pass


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _say(text: str) -> None:
    """Write one line to the process's own stdout (fd 1, what torchrun captures), even if
    the script replaced sys.stdout."""
    _flush_stdio()
    try:
        os.write(1, (text + "\n").encode())
    except OSError:
        pass


def finish(code: int, interrupted: bool = False) -> None:
    """What the interpreter does at exit, up to finalization, then os._exit(code).
    INTERRUPTED (Ctrl-C): no marker, and the process ends by SIGINT, as Python's does."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # private: joins non-daemon threads
    except BaseException:  # noqa: BLE001 - e.g. Ctrl-C while waiting: go on leaving
        pass
    atexit._run_exitfuncs()
    _flush_open_files()
    if interrupted:
        _flush_stdio()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    else:
        _say(MARKER.format(rank=os.environ.get("RANK", "0"), code=code))
    _flush_stdio()
    os._exit(code)


def run(argv: list[str]) -> int:
    """Run the script or module of ARGV (this runner's own arguments) and return the exit
    code Python would have left with; an uncaught exception is printed as Python does."""
    module = bool(argv) and argv[0] == "-m"
    if module:
        argv = argv[1:]
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    target, args = argv[0], argv[1:]
    # sys.path[0] is this runner's directory now; Python would have put the script's
    # (symbolic links resolved) or, with -m, the working directory there (not with -P).
    sys.argv = ["-m" if module else target, *args]
    if not getattr(sys.flags, "safe_path", False):
        sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.realpath(target))
    try:
        _run_module(target) if module else _run_script(target)
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        return exit_code(exc.code)
    except BaseException as exc:  # noqa: BLE001 - uncaught in the script: Python's own report
        tb = _runner_frames(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        return INTERRUPTED if isinstance(exc, KeyboardInterrupt) else 1
    return 0


def main(argv: list[str] | None = None) -> None:
    allow_same_user_tracers()
    _start_flight_record_server()
    steptime.install()
    code = run(sys.argv[1:] if argv is None else argv)
    finish(130 if code == INTERRUPTED else code, interrupted=code == INTERRUPTED)


if __name__ == "__main__":
    main()
