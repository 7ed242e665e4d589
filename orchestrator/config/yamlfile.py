"""A YAML file a user wrote, read strictly: UTF-8 only, YAML 1.2's core schema (so `on`,
`yes`, `1:30:00` and `010` are what they look like, not true, true, 5400 and 8) and no key
twice in one mapping. The result is the node tree, each node with its line, for kinds.py
to check; every error names the file and the line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError

NULL, BOOL, INT, FLOAT, STR = (f"tag:yaml.org,2002:{t}" for t in
                               ("null", "bool", "int", "float", "str"))
SEQ, MAP = "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"


class Strict(yaml.SafeLoader):
    """SafeLoader with YAML 1.2's core schema for plain scalars, and nothing else."""

    yaml_implicit_resolvers: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}


for _tag, _pattern, _first in (
        (NULL, r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
        (BOOL, r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
        (INT, r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
        (FLOAT, r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", list("-+0123456789."))):
    Strict.add_implicit_resolver(_tag, re.compile(_pattern), _first)


def read_text(path: Path, what: str, label: str = "") -> str:
    """PATH's text; InputError naming the file (as LABEL, if given: `-f job.yaml`) and
    WHAT it should be when it cannot be read, or is not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{label or path}: {exc.strerror}; give {what}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputError(f"{path} line {line}: byte 0x{data[exc.start]:02x} is not UTF-8; "
                         "save the file as UTF-8 text") from None


def compose(path: Path, what: str, label: str = "") -> yaml.Node | None:
    """PATH's YAML as a node tree (None: an empty file); InputError for a file that cannot
    be read, is not UTF-8 or not YAML, or gives a key twice in one mapping."""
    text = read_text(path, what, label)
    try:
        root = yaml.compose(text, Loader=Strict)
    except yaml.YAMLError as exc:
        raise InputError(f"{path} is not valid YAML: {exc}; fix its syntax") from None
    if root is not None:
        _refuse_duplicates(root, path, set())
    return root


def _refuse_duplicates(node: yaml.Node, path: Path, seen: set[int]) -> None:
    if id(node) in seen:   # an alias: checked where it was anchored
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[tuple[str, Any], int] = {}
        for key, value in node.value:
            mark = (key.tag, key.value) if isinstance(key, yaml.ScalarNode) else None
            line = key.start_mark.line + 1
            if mark is not None and mark in lines:
                raise InputError(f"{path} line {line}: {key.value!r} is given twice (also "
                                 f"on line {lines[mark]}); keep one of them")
            if mark is not None:
                lines[mark] = line
            _refuse_duplicates(value, path, seen)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicates(item, path, seen)


def scalar(node: yaml.ScalarNode, path: Path) -> Any:
    """A plain or quoted scalar's value, by its (core schema) tag."""
    text = node.value
    if node.tag == STR:
        return text
    if node.tag == NULL:
        return None
    if node.tag == BOOL:
        return text.lower() == "true"
    if node.tag == INT:
        base = {"0o": 8, "0x": 16}.get(text[:2], 10)
        return int(text[2:] if base != 10 else text, base)
    if node.tag == FLOAT:
        return float(text.replace(".inf", "inf").replace(".Inf", "inf")
                     .replace(".INF", "inf").replace(".nan", "nan").replace(".NaN", "nan")
                     .replace(".NAN", "nan"))
    raise InputError(f"{path} line {node.start_mark.line + 1}: the tag {node.tag} is not "
                     "understood here; leave it out")
