"""Step times of any script that trains with DistributedDataParallel or FSDP, without a
line of it changed: the worker runner (worker.py) installs this before the script runs.

When the script imports torch's DDP module, its `DistributedDataParallel.forward` is
wrapped. A step of a rank is the time from one training forward of its (first) DDP model
to the next; of that, the part spent waiting for its peers comes from DDP's own
instrumentation, the reducer's timers (`_get_ddp_logging_data()`: the time its gradient
all-reduce went on after its own backward had finished computing, which is what a rank
spends waiting for the slowest one). The rest is the rank's own work: data, forward,
backward, optimizer, which is what shows which node is slow (record/progress.py).
Samples per step are the batch dimension of the forward's first tensor argument.

About once a second (every step, for steps longer than that) the rank prints a beat, as a
script may print its own:

    ##clustertrain beat step_s=OWN wait_s=WAIT samples=N step=K by=ddp

(means over the steps since the last beat). FSDP (fully_shard, and the older
FullyShardedDataParallel): a step is the time from one training forward of the outermost
sharded module to the next, and the beat says `by=fsdp` without `wait_s=`: FSDP keeps no
timers of its collectives, so its steps are not split into own work and waiting (every
rank's step then lasts as long as the slowest's: the chart shows the pace, and naming a
straggler needs DDP's split or the script's beats). `by=` says the beat is measured, not the
script's: a rank that prints its own beats keeps them (the controller ignores the
measured ones of that rank). Evaluation forwards (no grad, or the model in eval mode)
are not steps, and the time around them is not counted.

The cost: most training forwards pass through four attribute checks and a counter (the
"unclocked" ones, about 2 us); once in `rate` iterations (about every READ_S / 2) two
forwards are clocked, and the meter sums the steps between them; the reducer computes its
figures at those iterations (torch's default is every 100th), and DDP's logging data is
read at most every READ_S. Standard library only until torch itself is imported by the
script.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .protocol import BEAT_MARKER

DDP_MODULE = "torch.nn.parallel.distributed"
FSDP_PACKAGE = "torch.distributed.fsdp"
EMIT_S = 1.0    # a beat at most this often (each step, when steps are longer)
READ_S = 0.2    # DDP's logging data read at most this often (~0.1 ms a read)
MAX_RATE = 64   # the reducer's figures at least every this many iterations
NS = 1e-9


def batch_size(args: Sequence[Any], kwargs: dict[str, Any], depth: int = 2) -> int | None:
    """The first dimension of the first tensor among a forward's arguments (inside lists,
    tuples and dicts, DEPTH levels down: a (x, y) batch, a tokenizer's dict), or None."""
    for value in (*args, *kwargs.values()):
        shape = getattr(value, "shape", None)
        if shape is not None and hasattr(value, "dim"):
            if len(shape) >= 1:
                return int(shape[0])
            continue
        if depth > 0 and isinstance(value, (list, tuple, dict)):
            inner = list(value.values()) if isinstance(value, dict) else list(value)
            found = batch_size(inner, {}, depth - 1)
            if found is not None:
                return found
    return None


def beat_line(step_s: float, wait_s: float | None, samples: int | None, step: int,
              by: str = "ddp") -> str:
    wait = f" wait_s={wait_s:.6f}" if wait_s is not None else ""
    count = f" samples={samples}" if samples is not None else ""
    return f"{BEAT_MARKER} step_s={step_s:.6f}{wait}{count} step={step} by={by}"


@dataclass
class StepMeter:
    """The steps of one rank's DDP model, summed until the next beat (pure but for the
    clock it is given).

    A step's wait is known for the steps whose timers were read (at most every READ_S),
    each paired with that same step's wall time; their share of waiting is applied to
    every step that all-reduced since the last beat (under no_sync(), for gradient
    accumulation, the others do not). Pairing matters: a slow peer's pace varies step to
    step, and a mean wait of some steps taken from a mean wall time of all would leave
    a fast rank's own work below zero.

    The reducer computes its timers' figures every `rate`-th iteration (DDP's
    ddp_runtime_logging_sample_rate; about 10 us each time, a few % of a short step): the
    rate follows the step time, so that one comes about every READ_S / 2. DDP logs an
    iteration's figures at the start of its next iteration (the next forward with grad
    that all-reduces), as iteration number N - 1 where this meter has counted N."""

    clock: Callable[[], float] = time.perf_counter
    emit_s: float = EMIT_S
    read_s: float = READ_S
    started: float | None = None      # the current step's training forward began
    syncing: bool = True              # the current step all-reduces its gradients
    steps: int = 0                    # every training step so far (the beat's step=)
    closed: bool = False              # this forward ended a step
    counted: int = 0                  # steps summed since the last beat, and their wall
    wall_synced: float = 0.0          # time: of steps that all-reduced...
    wall_local: float = 0.0           # ...and of those that did not
    paired_wall: float = 0.0          # steps whose timers were read: their wall time
    paired_wait: float = 0.0          # and the part of it they waited for their peers
    samples: list[int] = field(default_factory=list)
    iteration: int | None = None      # the reducer's iteration last read
    last_read: float = float("-inf")
    last_counted: float = float("-inf")   # the batch's size last looked at
    last_beat: float | None = None
    now: float = 0.0                  # the last forward's start: one clock read a step
    iterations: int = 0               # the reducer's iterations: forwards with grad, synced
    rate: int = 1                     # the reducer's figures every `rate`-th iteration
    synced_wall: float | None = None  # the wall time of the last step that all-reduced
    by: str = "ddp"                   # what measured the steps (the beat's by=)

    def forward(self, training: bool, synced: bool, samples: Callable[[], int | None],
                iterates: bool | None = None, unclocked: int = 0) -> None:
        """A forward of the model begins; TRAINING: with grad, in train mode; SYNCED: its
        backward will all-reduce (not under no_sync()); SAMPLES: its batch's size, asked
        for at most every READ_S (it rarely changes; asking costs microseconds);
        ITERATES: an iteration of the reducer (with grad and synced, in train mode or
        not; by default TRAINING and SYNCED); UNCLOCKED: the training forwards that
        all-reduced since the last one the meter saw, and passed it by (at most what
        `unclocked()` allowed): their steps are summed, not timed one by one."""
        now = self.now = self.clock()
        self.closed = False
        self.iterations += unclocked + ((training and synced) if iterates is None else iterates)
        self.steps += unclocked
        if not training:
            self.started = None   # an evaluation: the time around it is not a step's
            return
        if self.started is not None:
            wall = now - self.started   # the step begun then, and the unclocked ones
            self.closed = True
            self.counted += 1 + unclocked
            self.steps += 1
            if self.syncing:
                self.wall_synced += wall
                self.synced_wall = None if unclocked else wall
            else:
                self.wall_local += wall
        self.started, self.syncing = now, synced
        if now - self.last_counted >= self.read_s or not self.samples:
            self.last_counted = now
            size = samples()
            if size is not None:
                self.samples.append(size)
        if self.last_beat is None:
            self.last_beat = now

    def unclocked(self) -> int:
        """How many of the next forwards may pass the meter by (see forward()), when each
        trains and all-reduces as this one: up to the next iteration whose figures the
        reducer computes (a multiple of `rate`), which is clocked, and so is the one after
        it, which pairs that iteration's wall time with its figures."""
        if self.started is None or not self.syncing or self.rate < 2:
            return 0
        into = self.iterations % self.rate
        return 0 if into == 0 else self.rate - into - 1

    def wants_reading(self) -> bool:
        """Whether to read the reducer's timers now: this forward logged the figures of
        the last step that all-reduced."""
        return self.closed and self.syncing and self.synced_wall is not None \
            and (self.iterations - 1) % self.rate == 0 \
            and self.now - self.last_read >= self.read_s

    def read(self, data: dict[str, Any]) -> None:
        """DDP's logging data, read after a forward began: the reducer's timers of the
        iteration before it, the last step that all-reduced."""
        self.last_read = self.now
        iteration = data.get("iteration")
        comm = data.get("backward_comm_time")
        overlap = data.get("backward_compute_comm_overlap_time")
        if self.synced_wall is None or iteration == self.iteration \
                or iteration != self.iterations - 1 or not isinstance(comm, int) or comm <= 0:
            return   # not the figures of that step (or none): nothing to pair
        self.iteration = iteration
        wall = self.synced_wall
        wait = max(0, comm - (overlap if isinstance(overlap, int) else 0)) * NS
        self.paired_wall += wall
        self.paired_wait += min(wait, wall)

    def beat(self) -> str | None:
        """The beat line due now (then a new sum begins), or None."""
        if not self.counted or self.last_beat is None \
                or self.now - self.last_beat < self.emit_s:
            return None
        step = (self.wall_synced + self.wall_local) / self.counted
        wait = None
        if self.paired_wall > 0:
            wait = self.paired_wait / self.paired_wall * self.wall_synced / self.counted
        own = step - (wait or 0.0)
        samples = round(sum(self.samples) / len(self.samples)) if self.samples else None
        line = beat_line(max(own, 1e-6), wait, samples, self.steps, self.by)
        self.rate = max(1, min(MAX_RATE, int(self.read_s / 2 / step))) if step > 0 else 1
        self.counted, self.wall_synced, self.wall_local = 0, 0.0, 0.0
        self.paired_wall = self.paired_wait = 0.0
        self.samples = []
        self.last_beat = self.now
        return line


def say(line: str) -> None:
    """LINE on the rank's stdout, after what the script printed so far."""
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - the script's stdout is its own business
        pass
    try:
        os.write(1, (line + "\n").encode())
    except OSError:
        pass


def instrument(ddp_class: Any, meter: StepMeter, out: Callable[[str], None] = say) -> None:
    """Wrap DDP_CLASS.forward so that METER sees the forwards of the model that trains (the
    first; once it is gone, the next), and OUT gets its beats. Torch is the script's:
    imported by now (DDP_CLASS is torch's), and not by this module, which runs in any
    Python.

    Most forwards of a training loop take the short way: the model is the one timed, it
    trains, grad is on and it all-reduces (as at the forward the meter saw last), and the
    meter allowed as many to pass unclocked (StepMeter.unclocked); they cost a few checks.
    Any other forward goes to the meter."""
    grad_enabled = sys.modules["torch"].is_grad_enabled
    original = ddp_class.forward
    tracked: weakref.ref | None = None   # the model timed (its callback says when it is gone)
    target: int | None = None            # its id() while it lives
    left = allowed = applied = 0         # unclocked forwards left, allowed; the rate set

    def gone(_: weakref.ref) -> None:   # the model was freed: time the next one that trains
        nonlocal tracked, target, left, allowed, applied
        tracked = target = None
        left = allowed = applied = 0
        meter.started = None

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal left
        if left and id(self) == target and self.training and grad_enabled() \
                and self.require_backward_grad_sync:
            left -= 1
            return original(self, *args, **kwargs)
        return clocked(self, args, kwargs)

    def clocked(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        nonlocal tracked, target, left, allowed, applied
        grad = grad_enabled()
        training = grad and bool(self.training)
        if target is None and training and "require_backward_grad_sync" in vars(self):
            tracked, target = weakref.ref(self, gone), id(self)
        if id(self) != target:   # (target is None once the timed model is gone)
            return original(self, *args, **kwargs)
        synced = bool(self.require_backward_grad_sync)
        meter.forward(training, synced, lambda: batch_size(args, kwargs), grad and synced,
                      unclocked=allowed - left)
        left = allowed = 0
        if meter.rate != applied:
            applied = meter.rate
            rate = getattr(self, "_set_ddp_runtime_logging_sample_rate", None)
            if rate is not None:
                rate(meter.rate)
        result = original(self, *args, **kwargs)   # logs the last iteration's figures
        if training:
            if meter.wants_reading():
                try:
                    meter.read(self._get_ddp_logging_data())
                except Exception:  # noqa: BLE001 - a torch without it: step times only
                    meter.last_read = float("inf")
            line = meter.beat()
            if line is not None:
                out(line)
            if meter.rate == applied:   # a new rate applies from the next clocked forward
                left = allowed = meter.unclocked()
        return result

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    forward.__doc__ = original.__doc__
    ddp_class.forward = forward


def instrument_fsdp(fsdp: Any, meter: StepMeter, out: Callable[[str], None] = say) -> None:
    """Time the steps of the first sharded model that trains: FSDP's package FSDP (torch
    has imported it) gets a `fully_shard` that also hooks each module it shards, and
    FullyShardedDataParallel.forward a wrapper; both count a forward only at the outermost
    sharded module (the inner ones run inside it)."""
    torch = sys.modules["torch"]
    depth = [0]                       # sharded forwards going on, nested
    tracked: list[weakref.ref] = []   # the outermost model that trained first

    def begin(module: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        depth[0] += 1
        if depth[0] != 1:
            return
        training = torch.is_grad_enabled() and bool(module.training)
        if not tracked and training:
            tracked.append(weakref.ref(module))
        if tracked and tracked[0]() is module:
            meter.forward(training, True, lambda: batch_size(args, kwargs))

    def end(module: Any) -> None:
        depth[0] = max(0, depth[0] - 1)
        if depth[0] == 0 and tracked and tracked[0]() is module:
            line = meter.beat()
            if line is not None:
                out(line)

    shard = getattr(fsdp, "fully_shard", None)
    if shard is not None:
        @functools.wraps(shard)
        def fully_shard(module: Any, *args: Any, **kwargs: Any) -> Any:
            result = shard(module, *args, **kwargs)
            for m in module if isinstance(module, (list, tuple)) else [module]:
                m.register_forward_pre_hook(lambda mod, a, kw: begin(mod, a, kw),
                                            with_kwargs=True)
                m.register_forward_hook(lambda mod, a, kw, o: end(mod), with_kwargs=True,
                                        always_call=True)
            return result

        fsdp.fully_shard = fully_shard
    wrapper = getattr(fsdp, "FullyShardedDataParallel", None)
    if wrapper is not None:
        original = wrapper.forward

        @functools.wraps(original)
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            begin(self, args, kwargs)
            try:
                return original(self, *args, **kwargs)
            finally:
                end(self)

        wrapper.forward = forward


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the modules of torch that INSTRUMENTS names ({module: what to do with it once
    it has run}) with the finders after it; leaves sys.meta_path once all were found."""

    def __init__(self, instruments: dict[str, Callable[[Any], None]]) -> None:
        self.instruments = instruments

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        todo = self.instruments.pop(fullname, None)
        if todo is None:
            return None
        if not self.instruments:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            try:
                todo(module)
            except Exception as exc:  # noqa: BLE001 - the script runs on, unmeasured
                print(f"[clustertrain] no step times from {fullname}: "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Time the steps of the DDP or FSDP model the script will make (when it makes one)."""
    ddp, fsdp = StepMeter(), StepMeter(by="fsdp")
    instruments = {
        DDP_MODULE: lambda m: instrument(m.DistributedDataParallel, ddp),
        FSDP_PACKAGE: lambda m: instrument_fsdp(m, fsdp),
    }
    instruments = {name: f for name, f in instruments.items() if name not in sys.modules}
    if instruments:
        sys.meta_path.insert(0, _Finder(instruments))
