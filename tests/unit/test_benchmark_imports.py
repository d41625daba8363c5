"""The benchmarks' children import models from the test tree (``sys.path.insert(0, str(REPO / ...))``
then ``from oom_cgroup_child import Encoder``). When those helpers moved, two benchmarks kept the
old folder and failed only when run: this reads every benchmark's source and checks that each folder
it puts on the path exists and holds the modules imported beside it that nothing else provides."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted((REPO / "benchmarks").glob("*.py"))


def _repo_path(node: ast.AST) -> Path | None:
    """``REPO / "a" / "b"`` (inside ``str(...)`` or not) as a path under the repository, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str" and node.args:
        node = node.args[0]
    parts: list[str] = []
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        if not (isinstance(node.right, ast.Constant) and isinstance(node.right.value, str)):
            return None
        parts.append(node.right.value)
        node = node.left
    if isinstance(node, ast.Name) and node.id == "REPO":
        return REPO.joinpath(*reversed(parts))
    return None


def _path_inserts(fn: ast.AST) -> list[Path]:
    found = []
    for call in ast.walk(fn):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "insert"
                and ast.unparse(call.func.value) == "sys.path" and len(call.args) == 2):
            path = _repo_path(call.args[1])
            if path is not None:
                found.append(path)
    return found


@pytest.mark.parametrize("source", BENCHMARKS, ids=lambda p: p.name)
def test_what_a_benchmark_puts_on_the_path_exists_and_holds_what_it_imports(source: Path) -> None:
    tree = ast.parse(source.read_text())
    for fn in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        folders = _path_inserts(fn) if fn is not tree else [p for s in tree.body for p in _path_inserts(s)]
        for folder in folders:
            assert folder.is_dir(), f"{source.name} puts {folder.relative_to(REPO)} on sys.path: no such folder"
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    top = node.module.split(".")[0]
                    if importlib.util.find_spec(top) is None:  # nothing installed provides it
                        assert (folder / f"{top}.py").exists() or (folder / top).is_dir(), (
                            f"{source.name} imports {top} from {folder.relative_to(REPO)}, which has no such module")
