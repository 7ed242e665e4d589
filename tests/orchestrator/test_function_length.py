"""No function in the orchestrator is too long to hold in one's head (issue 52): each is
measured as Python's parser sees it, from its `def` to its last line (decorators not
counted), nested functions and methods each on their own."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
LIMIT = 80   # lines


def lengths(root: Path = PACKAGE) -> dict[str, int]:
    """'FILE::Qualified.name' -> lines, of every function under ROOT."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    found[f"{path}::{name}"] = child.end_lineno - child.lineno + 1
                visit(child, path, f"{name}.")
            else:
                visit(child, path, prefix)

    for file in sorted(root.rglob("*.py")):
        visit(ast.parse(file.read_text(), str(file)), file.relative_to(root).as_posix(), "")
    return found


def test_no_function_in_the_orchestrator_is_over_80_lines() -> None:
    over = {name: n for name, n in lengths().items() if n > LIMIT}
    assert not over, (f"functions over {LIMIT} lines (split them into functions of one job "
                      f"each): {over}")


def test_the_measure_names_methods_and_nested_functions_and_counts_def_to_end(
        tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.py").write_text(
        "import functools\n"
        "class A:\n"
        "    @functools.cache\n"
        "    def f(self):\n"
        "        def g():\n"
        "            return 1\n"
        "\n"
        "        return g()\n"
        "async def h(): pass\n")
    assert lengths(tmp_path) == {"sub/m.py::A.f": 5, "sub/m.py::A.f.g": 2, "sub/m.py::h": 1}
