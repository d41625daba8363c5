"""The architecture is a contract (docs/architecture.md): imports only go down the layers (the
import-linter contracts in pyproject.toml), no module takes part in an import circle, and modules of
the package import each other at the top, never inside a function."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "memprof_otel"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(project: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(project)}  # this tree's memprof_otel, not an installed one
    return subprocess.run([str(LINT_IMPORTS), "--config", str(project / "pyproject.toml"), "--no-cache"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_are_kept():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path: Path):
    # GIVEN a copy of the package where the pure peak tracker imports the composition root
    shutil.copytree(PACKAGE, tmp_path / "memprof_otel", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    peaks = tmp_path / "memprof_otel" / "attribution" / "peaks.py"
    peaks.write_text(peaks.read_text() + "\nfrom ..runtime import runtime  # noqa: E402,F401\n")
    # WHEN the contracts are checked
    r = _lint(tmp_path)
    # THEN the layers contract is broken at exactly that import
    assert r.returncode != 0, r.stdout
    assert "Layers: imports only go down BROKEN" in r.stdout
    assert "memprof_otel.attribution.peaks -> memprof_otel.runtime" in r.stdout


def test_no_module_is_part_of_an_import_circle():
    # imports under `if TYPE_CHECKING:` count too: a circle there is one contract written in two files
    graph = grimp.build_graph("memprof_otel", exclude_type_checking_imports=False)
    circles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if graph.chain_exists(importer=imported, imported=module):
                circles.append((module, imported))
    assert circles == []


def _function_level_imports() -> list[tuple[str, int, ast.Import | ast.ImportFrom]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        found.append((str(path.relative_to(ROOT)), node.lineno, node))
    return found


def test_modules_of_the_package_are_never_imported_inside_a_function():
    inner = [f"{path}:{line}" for path, line, node in _function_level_imports()
             if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("memprof_otel"))
             or isinstance(node, ast.Import) and any(a.name.startswith("memprof_otel") for a in node.names)]
    assert inner == []


def test_every_function_level_import_says_why():
    # optional or heavy dependencies only (matplotlib, pynvml, the OTel SDK, torch internals): a
    # comment on the line or just above it, or a block of imports whose first line has one
    missing = []
    for path, line, _ in _function_level_imports():
        lines = (ROOT / path).read_text().splitlines()
        i = line - 1
        while i > 0 and lines[i - 1].lstrip().startswith(("import ", "from ")) and "#" not in lines[i]:
            i -= 1  # walk up a block of imports to its first line
        if "#" not in lines[i] and not lines[i - 1].lstrip().startswith("#"):
            missing.append(f"{path}:{line}")
    assert missing == []


def test_the_package_top_level_holds_at_most_ten_modules() -> None:
    """Packages name the architecture: a new module goes into the package that owns its data, not
    beside ``runtime.py`` (the package's entry files do not count)."""
    import memprof_otel
    top = Path(memprof_otel.__file__).parent
    modules = sorted(p.name for p in top.glob("*.py") if p.name not in ("__init__.py", "__main__.py", "_version.py", "_log.py"))
    assert len(modules) <= 10, modules
