"""A sweep's description: a job file of `train`'s (every key `train -f` takes) with a
`sweep:` section, read and checked whole before any node is touched, and the trials it
stands for. Each trial is an ordinary run of that job with its parameters appended to the
script's arguments.

    sweep:
      method: grid              # grid | random (with `trials: N`, and a `seed`)
      parameters:               # the script's options, as typed
        --lr: [0.2, 0.05]       #   a list: its values (random: one of them)
        --width: {min: 4, max: 16}        # random only: drawn (whole numbers stay whole)
        --wd: {min: 1e-5, max: 1e-2, log: true}
      metric: test_loss         # a key of the trial's FINAL_METRICS
      goal: minimize            # or maximize
      parallel: 6               # trials at once (default: as many as fit)
      max_failures: 3           # failed trials before the sweep stops
      early_stop: {method: median, after: 200}   # early.py: a trial worse than the others

A value wrong on its face is refused naming the file, its line and the fix, as `train -f`
refuses a job file's.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..config.kinds import Flag, Kind, ListOf, Number, Record, Text, Whole, line
from ..errors import InputError
from ..run.spec import Given, RunSpec, read_job_file
from .early import METHODS as EARLY_METHODS, MIN_TRIALS, EarlyStop

SECTION = "sweep"
METHODS = ("grid", "random")
GOALS = ("minimize", "maximize")
MAX_TRIALS = 1000          # a sweep of more is a mistake more often than a plan
MAX_FAILURES = 3           # failed trials before the sweep stops (its default)
DIGITS = 6                 # significant digits of a drawn number, as the script reads it


@dataclass(frozen=True)
class Parameter:
    """One option of the script and what it takes: VALUES (a grid's, or random's choice),
    or a range LOW..HIGH drawn at random (LOG: evenly in its logarithm; WHOLE: whole
    numbers, when both ends are written as such)."""

    flag: str
    values: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    log: bool = False
    whole: bool = False

    @property
    def is_range(self) -> bool:
        return self.low is not None

    def draw(self, rng: random.Random) -> str:
        """One value, as the script is given it."""
        if not self.is_range:
            return rng.choice(self.values)
        assert self.low is not None and self.high is not None
        if self.log:
            x = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            x = rng.uniform(self.low, self.high)
        if self.whole:
            return str(min(int(self.high), max(int(self.low), round(x))))
        return format(x, f".{DIGITS}g")


@dataclass(frozen=True)
class Trial:
    """One run of the sweep: its number (1, 2, ...) and its parameters' values."""

    number: int
    values: tuple[tuple[str, str], ...]

    @property
    def args(self) -> list[str]:
        """What is appended to the script's arguments."""
        return [word for pair in self.values for word in pair]


@dataclass(frozen=True)
class SweepSpec:
    method: str
    parameters: tuple[Parameter, ...]
    metric: str
    goal: str = "minimize"
    trials: int | None = None       # random's number of trials
    seed: int = 0
    parallel: int | None = None     # None: as many as fit
    max_failures: int = MAX_FAILURES
    early_stop: EarlyStop | None = None

    def expand(self) -> list[Trial]:
        """The trials, numbered from 1: a grid's every combination (the last parameter
        changing fastest), or random's draws (the same seed, the same trials)."""
        if self.method == "grid":
            combos = itertools.product(*([(p.flag, v) for v in p.values]
                                         for p in self.parameters))
            return [Trial(i, tuple(c)) for i, c in enumerate(combos, 1)]
        rng = random.Random(self.seed)
        assert self.trials is not None
        return [Trial(i, tuple((p.flag, p.draw(rng)) for p in self.parameters))
                for i in range(1, self.trials + 1)]


# -- reading the section ----------------------------------------------------------------------
VALUE = Text("a value", numbers=True)
RANGE_KEYS = {"min": Number(), "max": Number(), "log": Flag(), "choice": ListOf(VALUE)}
EARLY_KEYS = {"method": Text(), "after": Whole(), "min_trials": Whole()}
EARLY_FORM = "{method: median, after: STEPS} (and min_trials: N, 3 by default)"
PARAMETER_FORMS = ("a list of its values ([0.1, 0.01]), a range ({min: 1e-4, max: 0.1, "
                   "log: true}) or a choice ({choice: [adam, sgd]})")


class _Parameters(Kind):
    """The `parameters:` mapping: each key an option of the script, each value a list, a
    range or a choice; read with the line of each."""

    what = "a mapping of the script's options to their values"

    def fits(self, node: yaml.Node) -> bool:
        return isinstance(node, yaml.MappingNode) and bool(node.value)

    def value(self, node: yaml.Node, path: Path, name: str) -> list[tuple[Parameter, int]]:
        found: list[tuple[Parameter, int]] = []
        for key, value in node.value:
            flag = Text("an option of the script").read(key, path, f"a key of {name}")
            where = f"{path} line {line(key)}: {name}.{flag}"
            if not flag.startswith("-") or flag.strip("-") == "":
                raise InputError(f"{where}: a parameter is an option of the script, written "
                                 f"as the script takes it (`--{flag.lstrip('-') or 'lr'}`)")
            if any(flag == p.flag for p, _ in found):
                raise InputError(f"{where}: given twice")
            found.append((_parameter(flag, value, path, where, f"{name}.{flag}"),
                          line(key)))
        return found


def _parameter(flag: str, node: yaml.Node, path: Path, where: str, name: str) -> Parameter:
    if isinstance(node, yaml.SequenceNode):
        return Parameter(flag, _values(ListOf(VALUE).read(node, path, name), where))
    if not isinstance(node, yaml.MappingNode):
        raise InputError(f"{where} must be {PARAMETER_FORMS}")
    given = Record(RANGE_KEYS, hint=f"{flag} takes {PARAMETER_FORMS}").read(node, path, name)
    if "choice" in given:
        if set(given) != {"choice"}:
            raise InputError(f"{where}: a choice takes no min, max or log")
        return Parameter(flag, _values(given["choice"], where))
    if set(given) - {"log"} != {"min", "max"}:
        raise InputError(f"{where}: a range needs both min and max ({PARAMETER_FORMS})")
    low, high, log = given["min"], given["max"], given.get("log", False)
    if not low < high:
        raise InputError(f"{where}: min ({low}) must be below max ({high})")
    if log and low <= 0:
        raise InputError(f"{where}: a range with log: true must be above 0 (min is {low})")
    return Parameter(flag, low=float(low), high=float(high), log=log,
                     whole=isinstance(low, int) and isinstance(high, int))


def _values(values: list[str], where: str) -> tuple[str, ...]:
    if not values:
        raise InputError(f"{where}: give at least one value")
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise InputError(f"{where}: {', '.join(twice)} given more than once")
    return tuple(values)


class _Section(Kind):
    """The `sweep:` section, read into a SweepSpec (its checks name each key's line)."""

    what = "a mapping (method, parameters, metric, ...)"
    keys: Mapping[str, Kind] = {
        "method": Text(), "parameters": _Parameters(), "metric": Text(), "goal": Text(),
        "trials": Whole(), "seed": Whole(), "parallel": Whole(), "max_failures": Whole(),
        "early_stop": Record(EARLY_KEYS, hint=f"early_stop takes {EARLY_FORM}")}

    def fits(self, node: yaml.Node) -> bool:
        return isinstance(node, yaml.MappingNode)

    def value(self, node: yaml.Node, path: Path, name: str) -> SweepSpec:
        got = Record(self.keys, hint=f"a sweep takes {', '.join(self.keys)}").located(
            node, path, name)

        def at(key: str) -> str:
            return f"{path} line {got[key].line if key in got else line(node)}: {name}.{key}"

        for key in ("method", "parameters", "metric"):
            if key not in got:
                raise InputError(f"{path} line {line(node)}: {name} needs `{key}:` "
                                 + {"method": "(grid or random)",
                                    "parameters": "(the script's options and their values)",
                                    "metric": "(a key of the trial's FINAL_METRICS to rank "
                                              "the trials by)"}[key])
        method, goal = got["method"].value, got.get("goal")
        if method not in METHODS:
            raise InputError(f"{at('method')} must be grid or random, not {method!r}")
        if goal is not None and goal.value not in GOALS:
            raise InputError(f"{at('goal')} must be minimize or maximize, not "
                             f"{goal.value!r}")
        for key, least in (("trials", 1), ("parallel", 1), ("max_failures", 0)):
            if key in got and got[key].value < least:
                raise InputError(f"{at(key)} must be at least {least}, not {got[key].value}")
        parameters = got["parameters"].value
        if method == "grid":
            ranges = [(p, n) for p, n in parameters if p.is_range]
            if ranges:
                p, n = ranges[0]
                raise InputError(f"{path} line {n}: {name}.parameters.{p.flag}: a grid takes "
                                 "a list of values, not a range: list them, or use method: "
                                 "random")
            if "trials" in got:
                raise InputError(f"{at('trials')}: a grid runs every combination of its "
                                 "values; trials is for method: random")
            count = math.prod(len(p.values) for p, _ in parameters)
        else:
            if "trials" not in got:
                raise InputError(f"{at('method')}: random needs `trials: N` (how many to "
                                 "draw)")
            count = got["trials"].value
        if count > MAX_TRIALS:
            raise InputError(f"{at('parameters')}: {count} trials; a sweep runs at most "
                             f"{MAX_TRIALS}: fewer values, or method: random with trials")
        early = _early_stop(got["early_stop"].value, at("early_stop")) \
            if "early_stop" in got else None
        return SweepSpec(method=method, parameters=tuple(p for p, _ in parameters),
                         metric=got["metric"].value,
                         goal=goal.value if goal is not None else "minimize",
                         trials=got["trials"].value if "trials" in got else None,
                         seed=got["seed"].value if "seed" in got else 0,
                         parallel=got["parallel"].value if "parallel" in got else None,
                         max_failures=got["max_failures"].value if "max_failures" in got
                         else MAX_FAILURES, early_stop=early)


def _early_stop(given: dict[str, Any], where: str) -> EarlyStop:
    if given.get("method") not in EARLY_METHODS or "after" not in given:
        raise InputError(f"{where} must be {EARLY_FORM}"
                         + (f", not method {given['method']!r}" if "method" in given and
                            given["method"] not in EARLY_METHODS else ""))
    if given["after"] < 0 or given.get("min_trials", MIN_TRIALS) < 1:
        raise InputError(f"{where}: after must be at least 0 and min_trials at least 1")
    return EarlyStop(after=given["after"], min_trials=given.get("min_trials", MIN_TRIALS))


def read_sweep_file(path: Path) -> tuple[dict[str, Given], SweepSpec]:
    """The job's values (for the run spec, as `train -f` reads them) and the sweep; an
    InputError naming the line for anything wrong on its face, and for a swept option
    that the job's own `args` give too."""
    given = read_job_file(path, RunSpec, extra={SECTION: _Section()})
    if SECTION not in given:
        raise InputError(f"{path} has no `{SECTION}:` section: a sweep file is a job file "
                         "(train -f) with one (method, parameters, metric); see "
                         "docs/sweeps.md")
    sweep: SweepSpec = given.pop(SECTION).value
    args: list[Any] = list(given["args"].value) if "args" in given else []
    for p in sweep.parameters:
        if any(a == p.flag or str(a).startswith(p.flag + "=") for a in args):
            raise InputError(f"{given['args'].label}: {p.flag} is given there and swept: "
                             "take it out of args (each trial gets its own)")
    return given, sweep
