"""An environment file (conda's format: `name:`, `channels:`, `dependencies:` with a
`- pip:` list), read through the one strict loader (config/) and checked to its nested
values: `pip: numpy` (text where a list belongs) is refused naming its line, never read
letter by letter. `env create` and `wheelhouse` both read it here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config.kinds import Either, ListOf, Record, Text, read_file

PIP = Record({"pip": ListOf(Text("a pip requirement"), "a list of pip requirements")},
             "a 'pip:' list")
ENV_FILE = Record({
    "name": Text("the environment's name"),
    "channels": ListOf(Text("a conda channel"), "a list of conda channels"),
    "dependencies": ListOf(Either((Text("a conda package", numbers=True), PIP),
                                  "a package string or a 'pip:' list"),
                           "a list of packages (and a '- pip:' list)"),
}, closed=False)   # conda's other keys (prefix, variables) are conda's


@dataclass(frozen=True)
class EnvironmentFile:
    path: Path
    name: str | None
    channels: tuple[str, ...]
    conda: tuple[str, ...] | None     # None: no dependencies: list
    pip: tuple[str, ...]


def read_environment(path: Path, label: str, what: str) -> EnvironmentFile:
    """PATH's environment; InputError naming the file (as LABEL), the line and the fix for
    anything that is not UTF-8 YAML of that format (WHAT: the file, in the verb's words)."""
    got = {k: v.value for k, v in read_file(path, ENV_FILE, what, label).items()}
    deps = got.get("dependencies")
    return EnvironmentFile(
        path=path, name=got.get("name"), channels=tuple(got.get("channels") or ()),
        conda=None if deps is None else tuple(d for d in deps if isinstance(d, str)),
        pip=tuple(p for d in deps or () if isinstance(d, dict) for p in d.get("pip") or ()))
