"""Which end of a node's part of a run is the node's fault: the one rule, for the
controller (run/recovery.py, from a run's summary) and for the nodes (recover.py, from a
failed peer's state on the share), so that an attached run and a detached one recover
from the same ends.

A node's fault: it was lost (no word from it), its supervisor failed, or its torchrun or
one of its ranks was killed by a signal that was not a stop. Anything else is the
script's (an exception, an exit code it chose) or nobody's (a stop, a hang), and is not
retried.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any

from .protocol import End

STOPS = {signal.SIGTERM, signal.SIGINT}


def killed(code: Any, shell_form: bool = False) -> str | None:
    """'SIGKILL' for a code that says a signal (not a stop) ended the process: -N, or
    with SHELL_FORM also 128+N (how a node's supervisor writes its torchrun's end)."""
    if not isinstance(code, int):
        return None
    number = -code if code < 0 else code - 128 if shell_form and 128 < code < 160 else 0
    if not number:
        return None
    try:
        sig = signal.Signals(number)
    except ValueError:
        return f"signal {number}"
    return None if sig in STOPS else sig.name


def node_fault(reason: object, why: str, code: Any) -> str | None:
    """Why a node's end (REASON as it wrote it, WHY, its torchrun's CODE as its supervisor
    wrote it) was the node's fault, in the words a run's record and its output use; None
    when it was not."""
    if reason == End.LOST:
        return f"lost ({why or 'no word from it'})"
    if reason == End.SUPERVISOR_FAILED:
        return f"its supervisor failed ({why})" if why else "its supervisor failed"
    signalled = killed(code, shell_form=True)
    return f"its torchrun was killed ({signalled})" if signalled else None


def ranks_killed(codes: Mapping[Any, Any]) -> str | None:
    """Why a node whose torchrun failed is at fault by its ranks' exit CODES (rank ->
    code): some were killed by a signal that was not a stop, and none ended with a code
    of its own (then the script failed, and a killed rank followed from it)."""
    dead = {rank: killed(code) for rank, code in codes.items() if killed(code)}
    if not dead or any(isinstance(c, int) and c > 0 for c in codes.values()):
        return None
    return ", ".join(f"rank {r} killed ({s})" for r, s in sorted(dead.items()))
