"""The orchestrator's layers only point down: every import of every module in
orchestrator/ (read from its source: imports inside functions and under TYPE_CHECKING
too) goes to its own layer or one below it, in the order docs/architecture.md states, and
no chain of imports goes round in a circle."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from orchestrator.resources import project

ROOT = project().root
PACKAGE = ROOT / "orchestrator"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# One line of the layer list: "1. `errors.py`: ..." or "2. `node/`: ...".
LAYER_LINE = re.compile(r"^\d+\.\s+`(?P<entry>[\w.]+(?:\.py|/))`")


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: Path) -> dict[str, Path]:
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """The orchestrator modules that module NAME (at PATH) imports, with the line of
    each import, wherever in the module the import stands."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (here[:len(here) - node.level + 1] if node.level else [])
            origin = ".".join(base + ([node.module] if node.module else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in known
                       else origin for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == "orchestrator":
                yield target, node.lineno


def stated_layers(text: str) -> list[str]:
    """The layer list of docs/architecture.md's "Layers" section, lowest first, as
    module names (`run/` -> orchestrator.run, `errors.py` -> orchestrator.errors)."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    entries = [m["entry"] for line in section.splitlines() if (m := LAYER_LINE.match(line))]
    return ["orchestrator." + e.removesuffix("/").removesuffix(".py") for e in entries]


def layer_of(module: str, layers: list[str]) -> int | None:
    for i, layer in enumerate(layers):
        if module == layer or module.startswith(layer + "."):
            return i
    return None


def graph(package: Path) -> dict[str, list[tuple[str, int]]]:
    found = modules(package)
    return {name: sorted(set(imports(name, path, set(found)))) for name, path in found.items()}


def upward(package: Path, layers: list[str]) -> list[str]:
    """Each import that goes up the layers, or from or to a module in no layer."""
    wrong = []
    for module, targets in graph(package).items():
        if module == "orchestrator":
            continue   # the package itself: it holds nothing but its docstring
        mine = layer_of(module, layers)
        if mine is None:
            wrong.append(f"{module} is in no layer of docs/architecture.md")
            continue
        for target, line in targets:
            theirs = layer_of(target, layers)
            if theirs is None or theirs > mine:
                wrong.append(f"{module}:{line} imports {target}, a layer above it "
                             f"({layers[theirs] if theirs is not None else 'none'} over "
                             f"{layers[mine]})")
    return wrong


def circles(package: Path) -> list[list[str]]:
    """Every circle of imports between modules (one per strongly connected set)."""
    edges = {m: sorted({t for t, _ in ts if t != m}) for m, ts in graph(package).items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:   # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in edges.get(module, []):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in edges:
        if module not in index:
            visit(module)
    return found


def test_the_layers_are_stated_once_lowest_first() -> None:
    layers = stated_layers(ARCHITECTURE.read_text())
    assert layers[0] == "orchestrator.node" and layers[-1] == "orchestrator.__main__"
    assert len(layers) == len(set(layers))
    on_disk = {module_name(p, PACKAGE) for p in PACKAGE.glob("*.py")} | {
        f"orchestrator.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")}
    assert set(layers) == on_disk - {"orchestrator"}


def test_every_import_points_down_the_layers() -> None:
    assert upward(PACKAGE, stated_layers(ARCHITECTURE.read_text())) == []


def test_no_imports_go_round_in_a_circle() -> None:
    assert circles(PACKAGE) == []


def test_the_reader_sees_imports_inside_functions_and_finds_a_circle(tmp_path: Path) -> None:
    """The checks above find what they look for: a lazy import up the layers, and a
    circle closed by one."""
    package = tmp_path / "orchestrator"
    for folder in ("low", "high"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "low" / "record.py").write_text(
        "def write():\n    from ..high.page import draw  # lazy\n    return draw\n")
    (package / "high" / "page.py").write_text("from ..low.record import write\n\ndraw = 1\n")
    layers = ["orchestrator.low", "orchestrator.high"]
    assert upward(package, layers) == [
        "orchestrator.low.record:2 imports orchestrator.high.page, a layer above it "
        "(orchestrator.high over orchestrator.low)"]
    assert circles(package) == [["orchestrator.high.page", "orchestrator.low.record"]]
