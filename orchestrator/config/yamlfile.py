"""A YAML file a user wrote, read strictly: UTF-8 only, YAML 1.2's core schema (so `on`,
`yes`, `1:30:00` and `010` are what they look like, not true, true, 5400 and 8), no key
twice in one mapping, no tag (`!!int "two"`: a value is what it looks like, never what a
tag claims) and no alias (`*a`: a few lines cannot grow into a huge value). The result is
the node tree, each node with its line, for kinds.py to check; every error names the file
and the line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError

TAGS = "tag:yaml.org,2002:"   # what `!!` stands for
NULL, BOOL, INT, FLOAT, STR = (f"{TAGS}{t}" for t in ("null", "bool", "int", "float", "str"))
SEQ, MAP = f"{TAGS}seq", f"{TAGS}map"
KEY = object()   # a step into a mapping's key (not its value)


class Refused(yaml.YAMLError):
    """What a user's file may not hold, on LINE; compose() names the file."""

    def __init__(self, line: int, said: str) -> None:
        super().__init__(said)
        self.line = line


class Strict(yaml.SafeLoader):
    """SafeLoader with YAML 1.2's core schema for plain scalars, and nothing else: a tag or
    an alias is Refused, naming the value's place (`env.LR`, `args[1]`)."""

    yaml_implicit_resolvers: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.steps: list[object] = []   # the way from the root to the node being composed

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if isinstance(parent, yaml.MappingNode):
            step: object = KEY if index is None else getattr(index, "value", "?")
        else:
            step = index
        self.steps.append(step)
        try:
            _refuse_tag_or_alias(self.peek_event(), self.anchors, self.steps)
            return super().compose_node(parent, index)
        finally:
            self.steps.pop()


for _tag, _pattern, _first in (
        (NULL, r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
        (BOOL, r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
        (INT, r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
        (FLOAT, r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", list("-+0123456789."))):
    Strict.add_implicit_resolver(_tag, re.compile(_pattern), _first)


def _place(steps: list[object]) -> str:
    """The value's place as errors name it: `env.LR`, `args[1]`, `a key of env`."""
    name = ""
    for step in steps:
        if step is KEY:
            return f"a key of {name}" if name else "a key"
        if isinstance(step, int):
            name = f"{name}[{step}]"
        elif step is not None:
            name = f"{name}.{step}" if name else str(step)
    return name or "the file"


def _refuse_tag_or_alias(event: yaml.Event, anchors: dict[Any, yaml.Node],
                         steps: list[object]) -> None:
    place, line = _place(steps), event.start_mark.line + 1 if event.start_mark else 0
    if isinstance(event, yaml.AliasEvent) and event.anchor in anchors:
        anchored = anchors[event.anchor].start_mark.line + 1
        raise Refused(line, f"{place}: *{event.anchor} repeats the value anchored on line "
                            f"{anchored}; this file takes no aliases: write the value out")
    tag = getattr(event, "tag", None)
    if tag is None:
        return
    written = "!!" + tag[len(TAGS):] if tag.startswith(TAGS) else tag
    fix = "leave it out"
    if isinstance(event, yaml.ScalarEvent):
        quote = event.style if event.style in ("'", '"') else ""
        value = f"{quote}{event.value}{quote}"
        key = f"{steps[-1]}: " if isinstance(steps[-1], str) else ""
        fix += f" and write the value plainly ({key}{value})"
    raise Refused(line, f"{place}: the tag {written} is not read here; {fix}")


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
    except Refused as exc:
        raise InputError(f"{path} line {exc.line}: {exc}") from None
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
