"""An option declared once: a dataclass field whose metadata says everything else about
it (its kind in a file, its help, its spelling on the command line, its check). A verb's
parser, its file's keys, the spec read from both and the file written back all come from
the fields (`declared`); adding an option is adding one field."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .kinds import Kind


@dataclass(frozen=True)
class Option:
    """What a field is as an option. KEY: its file key and --KEY (default: the field's
    name); CHECK(value, label): the value as given (a file's, or the command line's)
    checked and turned into the field's, InputError naming LABEL otherwise; SPECIAL: read
    by the verb itself (the script and its arguments), not by the generic loop."""

    kind: Kind
    help: str
    key: str = ""
    flags: tuple[str, ...] = ()         # the command line's spelling (default: --KEY)
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    group: str = ""                     # where --help lists it; "nodes": one of that group
    check: Callable[[Any, str], Any] | None = None
    to_file: Callable[[Any], Any] | None = None
    completes: str = ""                 # "hosts": the inventory's names complete it
    special: bool = False
    positional: bool = False            # given by its place, not a --flag

    @property
    def label(self) -> str:
        """How an error names it when the command line gave it."""
        return self.flags[0] if self.flags else f"--{self.key.replace('_', '-')}"


def option(default: Any, declared: Option, *, factory: Callable[[], Any] | None = None) -> Any:
    """A field that is an option (FACTORY: its default, made fresh per spec)."""
    meta = {"option": declared}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Declared:
    """A field and its option, the option's key filled in."""

    name: str
    option: Option
    default: Any

    @property
    def key(self) -> str:
        return self.option.key


def declared(cls: type) -> tuple[Declared, ...]:
    """CLS's option fields, in their order."""
    found = []
    for f in dataclasses.fields(cls):
        opt = f.metadata.get("option")
        if opt is None:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
            else f.default
        found.append(Declared(f.name, dataclasses.replace(opt, key=opt.key or f.name),
                              default))
    return tuple(found)
