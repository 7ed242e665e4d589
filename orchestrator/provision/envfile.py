"""An environment file (conda's format: `name:`, `channels:`, `dependencies:` with a
`- pip:` list), read through the one strict loader (config/) and checked to its nested
values: `pip: numpy` (text where a list belongs) is refused naming its line, never read
letter by letter. Each entry is checked too, here on the controller, before any node is
touched: a pip line as PEP 508 (`packaging`), a conda line by conda's match-spec form
(CONDA_SPEC: `numpy=1.26`, `pytorch::pytorch>=2`, `scipy 1.11.* py311_0`), the python pin
as a Python version, and no package named twice. `env create` and `wheelhouse` both read
it here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ..config.kinds import Either, Kind, ListOf, Record, Text, line, read_file
from ..errors import InputError

# conda's match spec, the forms environment files use: [CHANNEL::]NAME, then nothing, or
# a version spec glued to it by its operator (`=1.26`, `>=2,<3`, `==1.26.4=BUILD`), or
# one after a space (`1.26.*`, `>=2.1`, `1.26.4 BUILD`). A version starts with a digit
# (conda's `2023c`, `1!2.0`, `1.26.*` too) or is `*`.
_OP = r"(?:==|!=|<=|>=|~=|<|>|=)"
_VERSION = r"(?:[0-9][A-Za-z0-9_.+!]*(?:\.?\*)?|\*)"
_CLAUSES = rf"{_VERSION}(?:[,|]{_OP}?{_VERSION})*"
_BUILD = r"[A-Za-z0-9_.*+-]+"
CONDA_SPEC = re.compile(
    rf"(?:(?P<channel>[A-Za-z0-9_][A-Za-z0-9_./-]*)::)?(?P<name>[A-Za-z0-9_][A-Za-z0-9_.-]*)"
    rf"(?:(?P<glued>{_OP}{_CLAUSES})(?:=(?P<build>{_BUILD}))?"
    rf"|\s+(?P<spaced>{_OP}?{_CLAUSES})(?:\s+{_BUILD})?)?")
PIP_FORM = "write NAME[extras][version][; marker], e.g. numpy>=1.26 or torch==2.13.0"


@dataclass(frozen=True)
class Entry:
    """One package line of the file, as written, with its package's name and its line."""

    text: str
    name: str         # pip: canonical (PEP 503); conda: lower case; "" for a pip option
    marker: str       # a pip line's environment marker ("" when none)
    line: int
    place: str        # where in the file: dependencies[2], dependencies[1].pip[0]


def python_release(text: str) -> Version | None:
    """TEXT as a plain Python release (3, 3.11, 3.11.9), else None."""
    try:
        version = Version(text)
    except InvalidVersion:
        return None
    plain = version.epoch == 0 and version.pre is None and version.post is None \
        and version.dev is None and version.local is None
    return version if plain and str(version) == text else None


def check_python_version(value: str) -> str:
    """VALUE, the nodes' Python as X.Y or X.Y.Z (the wheelhouse's --python-version);
    ValueError saying what to give instead."""
    if python_release(value) is None or not 2 <= value.count(".") + 1 <= 3:
        raise ValueError(f"{value!r} is not a Python version; give the nodes' Python as X.Y "
                         "or X.Y.Z, e.g. 3.11")
    return value


def _python_pin(text: str) -> str | None:
    """The version spec of a python line (`python=3.11.4=BUILD` -> `=3.11.4`, `python` ->
    ""), None for another package's."""
    found = re.fullmatch(r"(?:\S+::)?python(?P<rest>(?:[\s=<>!~].*)?)", text, re.IGNORECASE)
    if found is None:
        return None
    rest = found.group("rest").strip()
    spec = rest.split()[0] if rest else ""
    glued = re.fullmatch(r"(=[^=<>!~][^=]*)=[^=]*", spec)
    return glued.group(1) if glued else spec


def _pinned_versions(spec: str) -> list[str]:
    """The versions of a conda version spec (`>=3.10,<3.13` -> 3.10, 3.13), wildcards off."""
    versions = [re.sub(r"^" + _OP, "", c) for c in re.split(r"[,|]", spec) if c]
    return [re.sub(r"\.?\*$", "", v) for v in versions if v not in ("*", "")]


@dataclass(frozen=True)
class CondaLine(Kind):
    """A conda dependency: conda's match-spec form; python's version a Python version."""

    what: str = "a conda package"

    def fits(self, node: yaml.Node) -> bool:
        return Text(numbers=True).fits(node)

    def value(self, node: yaml.Node, path: Path, name: str) -> Entry:
        text = str(node.value).strip()
        found = CONDA_SPEC.fullmatch(text)
        where = f"{path} line {line(node)}: {name} {text!r}"
        pin = _python_pin(text)
        bad = [v for v in _pinned_versions(pin or "") if python_release(v) is None]
        if pin is not None and (bad or found is None):
            raise InputError(f"{where}: {(bad or [pin])[0]!r} is not a Python version; pin "
                             "it as python=3.11 (or python=3.11.9)")
        if found is None:
            raise InputError(f"{where} is not a conda package spec; write [CHANNEL::]NAME"
                             "[VERSION], e.g. numpy, numpy=1.26, numpy>=1.26,<2 or "
                             "pytorch::pytorch=2.5 (pip's packages go in the '- pip:' list)")
        return Entry(str(node.value), found.group("name").lower(), "", line(node), name)


@dataclass(frozen=True)
class PipLine(Kind):
    """A pip: entry: a PEP 508 requirement, or one of pip's options (`--extra-index-url
    URL`, `-e DIR`), which pip itself reads."""

    what: str = "a pip requirement"

    def fits(self, node: yaml.Node) -> bool:
        return Text().fits(node)

    def value(self, node: yaml.Node, path: Path, name: str) -> Entry:
        text = str(node.value).strip()
        if text.startswith("-"):
            return Entry(str(node.value), "", "", line(node), name)
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            hint = ("; pip pins a version with ==: " + re.sub(r"(?<![=<>!~])=(?!=)", "==",
                                                              text, count=1)
                    if re.search(r"^[A-Za-z0-9._-]+=[^=]", text) else
                    "; a URL is written NAME @ URL" if "://" in text else "")
            raise InputError(f"{path} line {line(node)}: {name} {text!r} is not a pip "
                             f"requirement ({str(exc).splitlines()[0]}); {PIP_FORM}{hint}"
                             ) from None
        return Entry(str(node.value), canonicalize_name(req.name), str(req.marker or ""),
                     line(node), name)


PIP = Record({"pip": ListOf(PipLine(), "a list of pip requirements")}, "a 'pip:' list")
ENV_FILE = Record({
    "name": Text("the environment's name"),
    "channels": ListOf(Text("a conda channel"), "a list of conda channels"),
    "dependencies": ListOf(Either((CondaLine(), PIP), "a package string or a 'pip:' list"),
                           "a list of packages (and a '- pip:' list)"),
}, closed=False)   # conda's other keys (prefix, variables) are conda's


@dataclass(frozen=True)
class EnvironmentFile:
    path: Path
    name: str | None
    channels: tuple[str, ...]
    conda: tuple[str, ...] | None     # None: no dependencies: list
    pip: tuple[str, ...]
    conda_names: tuple[str, ...] = ()   # the packages conda is asked for (not python, pip)
    pip_names: tuple[str, ...] = ()     # the pip: section's projects (canonical), once each


def _once_each(entries: list[Entry], path: Path) -> tuple[str, ...]:
    """The names of ENTRIES in their order; InputError for a package named twice (under
    the same marker: pip lines may pin it once per Python, say)."""
    seen: dict[tuple[str, str], Entry] = {}
    for entry in entries:
        if not entry.name:
            continue
        first = seen.setdefault((entry.name, entry.marker), entry)
        if first is not entry:
            raise InputError(f"{path} line {entry.line}: {entry.place} "
                             f"{entry.text.strip()!r} names {entry.name} again (line "
                             f"{first.line}: {first.text.strip()!r}); keep one of them")
    return tuple(dict.fromkeys(e.name for e in entries if e.name))


def read_environment(path: Path, label: str, what: str) -> EnvironmentFile:
    """PATH's environment; InputError naming the file (as LABEL), the line and the fix for
    anything that is not UTF-8 YAML of that format (WHAT: the file, in the verb's words)."""
    got = read_file(path, ENV_FILE, what, label)
    deps = got["dependencies"].value if "dependencies" in got else None
    if deps == []:
        raise InputError(f"{path} line {got['dependencies'].line}: dependencies lists no "
                         "package; name the environment's packages (e.g. - python=3.11, "
                         "- pip: [numpy])")
    conda = [d for d in deps or () if isinstance(d, Entry)]
    pip = [p for d in deps or () if isinstance(d, dict) for p in d.get("pip") or ()]
    conda_names = _once_each(conda, path)
    return EnvironmentFile(
        path=path, name=got["name"].value if "name" in got else None,
        channels=tuple(got["channels"].value if "channels" in got else ()),
        conda=None if deps is None else tuple(e.text for e in conda),
        pip=tuple(e.text for e in pip),
        conda_names=tuple(n for n in conda_names if n not in ("python", "pip")),
        pip_names=_once_each(pip, path))
