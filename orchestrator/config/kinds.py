"""The declared kind of each value in a user's file, and the check of a YAML node (from
yamlfile.py) against it, nested values included: a value of another kind is refused
naming the file, its line, the value's place (`args[0]`, `env.LR`) and what it must be.
A number where text is declared is taken as written (`lr: 1e-3` stays "1e-3"); a boolean
or an empty value there is refused, never turned into "True" or "" silently. A key given
no value is refused, never taken for "not given" (which would mean its default)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError
from .yamlfile import FLOAT, INT, NULL, STR, compose, scalar


def line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def shown(node: yaml.Node, path: Path) -> str:
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    return repr(scalar(node, path))  # type: ignore[arg-type]


class Kind:
    """What a value must be (`what`: in the user's words)."""

    what: str = "a value"

    def fits(self, node: yaml.Node) -> bool:
        """Whether NODE is of this kind at its top (its items are checked by read)."""
        raise NotImplementedError

    def read(self, node: yaml.Node, path: Path, name: str) -> Any:
        """NODE's value; InputError naming PATH, the line and NAME when it is not one."""
        if not self.fits(node):
            self.refuse(node, path, name)
        return self.value(node, path, name)

    def value(self, node: yaml.Node, path: Path, name: str) -> Any:
        return scalar(node, path)  # type: ignore[arg-type]

    def refuse(self, node: yaml.Node, path: Path, name: str) -> None:
        raise InputError(f"{path} line {line(node)}: {name} must be {self.what}, not "
                         f"{shown(node, path)}")


@dataclass(frozen=True)
class Text(Kind):
    """Text, not empty unless EMPTY; with NUMBERS a number is taken as its text."""

    what: str = "text"
    numbers: bool = False
    empty: bool = False

    def fits(self, node: yaml.Node) -> bool:
        tags = (STR, INT, FLOAT) if self.numbers else (STR,)
        return isinstance(node, yaml.ScalarNode) and node.tag in tags and (
            self.empty or node.value != "")

    def value(self, node: yaml.Node, path: Path, name: str) -> str:
        return str(node.value)


@dataclass(frozen=True)
class Whole(Kind):
    what: str = "a whole number"

    def fits(self, node: yaml.Node) -> bool:
        return isinstance(node, yaml.ScalarNode) and node.tag == INT


@dataclass(frozen=True)
class Number(Kind):
    what: str = "a number"

    def fits(self, node: yaml.Node) -> bool:
        return isinstance(node, yaml.ScalarNode) and node.tag in (INT, FLOAT)


@dataclass(frozen=True)
class Flag(Kind):
    what: str = "true or false"

    def fits(self, node: yaml.Node) -> bool:
        return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:bool"


@dataclass(frozen=True)
class ListOf(Kind):
    item: Kind = field(default_factory=Text)
    what: str = "a list"

    def fits(self, node: yaml.Node) -> bool:
        return isinstance(node, yaml.SequenceNode)

    def value(self, node: yaml.Node, path: Path, name: str) -> list[Any]:
        return [self.item.read(n, path, f"{name}[{i}]") for i, n in enumerate(node.value)]


@dataclass(frozen=True)
class MapOf(Kind):
    """NAME: value pairs, each value of one kind (a null one: NULL_AS, if it is given)."""

    item: Kind = field(default_factory=Text)
    what: str = "a mapping"
    null_as: str | None = None

    def fits(self, node: yaml.Node) -> bool:
        return isinstance(node, yaml.MappingNode)

    def value(self, node: yaml.Node, path: Path, name: str) -> dict[str, Any]:
        found = {}
        for key, value in node.value:
            label = Text("a name", numbers=True).read(key, path, f"a key of {name}")
            if self.null_as is not None and isinstance(value, yaml.ScalarNode) and \
                    scalar(value, path) is None:
                found[label] = self.null_as
            else:
                found[label] = self.item.read(value, path, f"{name}.{label}")
        return found


@dataclass(frozen=True)
class Either(Kind):
    """The first of KINDS that the node fits."""

    kinds: tuple[Kind, ...] = ()
    what: str = "a value"

    def fits(self, node: yaml.Node) -> bool:
        return any(k.fits(node) for k in self.kinds)

    def value(self, node: yaml.Node, path: Path, name: str) -> Any:
        return next(k for k in self.kinds if k.fits(node)).read(node, path, name)


@dataclass(frozen=True)
class Located:
    """A value and the line it is on."""

    value: Any
    line: int


@dataclass(frozen=True)
class Record(Kind):
    """A mapping of known keys, each of its own kind; CLOSED: no other key (the error
    says HINT). A key given no value (`key:`) is refused, and so is a null (`key: null`,
    `key: ~`) unless the key is one of NULLS: keys whose own value may be none, written
    so by the tool itself (`train --dry-run`'s `nodes: null`), read as not given."""

    keys: Mapping[str, Kind] = field(default_factory=dict)
    what: str = "a mapping"
    closed: bool = True
    hint: str = ""
    nulls: frozenset[str] = frozenset()

    def fits(self, node: yaml.Node) -> bool:
        return isinstance(node, yaml.MappingNode) and (not self.closed or all(
            isinstance(k, yaml.ScalarNode) and k.value in self.keys for k, _ in node.value))

    def read(self, node: yaml.Node, path: Path, name: str) -> Any:
        if not isinstance(node, yaml.MappingNode):
            self.refuse(node, path, name)
        return self.value(node, path, name)

    def value(self, node: yaml.Node, path: Path, name: str) -> dict[str, Any]:
        return {k: v.value for k, v in self.located(node, path, name).items()}

    def located(self, node: yaml.Node, path: Path, name: str = "") -> dict[str, Located]:
        """Each key given a value (a null one of NULLS: not), with its value and line."""
        found: dict[str, Located] = {}
        for key, value in node.value:
            label = Text("a name").read(key, path, f"a key of {name or 'the file'}")
            where = f"{name}.{label}" if name else label
            if label not in self.keys:
                if self.closed:
                    near = difflib.get_close_matches(label, self.keys, n=1)
                    raise InputError(f"{path} line {line(key)}: unknown key {label!r}"
                                     + (f" (did you mean {near[0]!r}?)" if near else "")
                                     + (f"; {self.hint}" if self.hint else ""))
                continue
            if isinstance(value, yaml.ScalarNode) and value.tag == NULL:
                if value.value and label in self.nulls:
                    continue
                raise InputError(f"{path} line {line(key)}: {where} is "
                                 f"{'null' if value.value else 'empty'}; give "
                                 f"{self.keys[label].what}, or remove the line to use the "
                                 "default")
            found[label] = Located(self.keys[label].read(value, path, where), line(key))
        return found


def read_file(path: Path, record: Record, what: str, label: str = "") -> dict[str, Located]:
    """A file that is one RECORD (WHAT: what it must be, for the errors; LABEL: how the
    user named the file), checked whole."""
    root = compose(path, what, label)
    if root is None or isinstance(root, yaml.ScalarNode) and scalar(root, path) is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise InputError(f"{path} is not {what}")
    return record.located(root, path)
