"""Each package says what is in it: its ``__init__.py`` docstring names every file and folder of the
package, one line each, names none that is gone, and says what of it is public; and
docs/architecture.md has a row for every package. A module added, moved or renamed without its
line fails here, so the lists cannot drift from the tree."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import memprof_otel

PACKAGE = Path(memprof_otel.__file__).resolve().parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
# a line of a package's list: ``name.py`` or ``name/`` (a sub-folder may be named with its path)
LISTED = re.compile(r"^``([\w.]+\.py|\w+/(?:[\w/]*/)?)``", re.M)


def packages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)


def contents(package: Path) -> set[str]:
    """What a package holds: its modules (``__init__.py`` aside) and its folders, ``name/``."""
    files = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    folders = {f"{p.name}/" for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"}
    return files | folders


def docstring(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""


def listed(doc: str) -> set[str]:
    """The first path component of each list line: ``vendor/pprof/`` lists ``vendor/``."""
    return {name if name.endswith(".py") else name.split("/", 1)[0] + "/" for name in LISTED.findall(doc)}


def rel(package: Path) -> str:
    return package.relative_to(PACKAGE).as_posix()


@pytest.mark.parametrize("package", packages(), ids=rel)
def test_the_package_docstring_lists_exactly_its_files(package: Path) -> None:
    doc = docstring(package)
    named = listed(doc) - {"__init__.py"}  # a package whose __init__ holds code may list it
    have = contents(package)
    assert not have - named, f"{rel(package)}/__init__.py does not list {sorted(have - named)}"
    assert not named - have, f"{rel(package)}/__init__.py lists what is not there: {sorted(named - have)}"


@pytest.mark.parametrize("package", packages(), ids=rel)
def test_the_package_docstring_says_what_is_public(package: Path) -> None:
    assert re.search(r"^Public: ", docstring(package), re.M), f"{rel(package)}/__init__.py: no 'Public:' paragraph"


def test_the_list_reader_finds_files_and_folders() -> None:
    doc = "Summary.\n\n``a.py`` one\n``b_c.py`` two\n``torch/`` three\n``vendor/pprof/`` four\nnot ``d.py``\n"
    assert listed(doc) == {"a.py", "b_c.py", "torch/", "vendor/"}


def test_architecture_has_a_row_for_every_package() -> None:
    rows = {m.group(1) for m in re.finditer(r"^\| `([\w/]+/)` \|", ARCHITECTURE.read_text(encoding="utf-8"), re.M)}
    # oom/ is part of the core row (it sits with config and errors in the layers)
    expected = {f"{rel(p)}/" for p in packages()} - {"oom/"}
    assert not expected - rows, f"docs/architecture.md has no row for {sorted(expected - rows)}"
    assert not rows - expected, f"docs/architecture.md has rows for packages that are gone: {sorted(rows - expected)}"
