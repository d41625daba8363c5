"""The repository stands alone: a clone in an empty directory has everything its tests, scripts and
docs refer to. Nothing tracked names a path outside the clone, the generated metric reference is
current, the licence is there and the user docs link only to files that exist in the repo."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".yaml", ".yml", ".json", ".txt", ".cfg", ".ini", ""}
# Paths that are the same on every Linux host (the kernel's files, system binaries, the temp dir)
# are fine; what a clone cannot have is a path into someone's workspace or a sibling checkout.
# Built from pieces so this file does not match its own patterns.
_OUTSIDE = re.compile("(?<![\\w.:/-])/(?:" + "|".join(["wo" + "rk", "ho" + "me", "ro" + "ot", "Us" + "ers",
                                                      "mn" + "t", "works" + "pace", "scra" + "tch"]) + ")/")
_SHARED = "../" + "shared"
_UP = re.compile(r"(?<![\w.])((?:\.\./)+)([\w.-]*)")
_PARENTS = re.compile(r"Path\(__file__\)\.resolve\(\)\.parents\[(\d+)\]")


def tracked_files() -> list[Path]:
    """The files a clone has: ``git ls-files`` in a checkout, else every file but build output."""
    if shutil.which("git") and (REPO / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
        return [REPO / p for p in out.decode().split("\0") if p]
    skip = {".venv", ".git", "__pycache__", "build", "dist", "out"}
    return [p for p in REPO.rglob("*") if p.is_file() and not skip & set(p.relative_to(REPO).parts)]


def _text_files() -> list[Path]:
    return [p for p in tracked_files() if p.suffix in TEXT_SUFFIXES and p.name != "LICENSE" and p.exists()]


def _inside(p: Path) -> bool:
    try:
        p.resolve().relative_to(REPO)
        return True
    except ValueError:
        return False


def outside_references(path: Path, text: str) -> list[str]:
    """What in ``text`` (the content of ``path``) names a place outside the repository."""
    found = [m.group(0) for m in _OUTSIDE.finditer(text)]
    if _SHARED in text:
        found.append(_SHARED)
    for m in _UP.finditer(text):  # "../x" relative to the file's folder must stay in the repo
        if not _inside(path.parent / m.group(1) / m.group(2)):
            found.append(m.group(0))
    depth = len(path.relative_to(REPO).parts)  # tests/unit/x.py: 3; its parents[2] is the repo
    for m in _PARENTS.finditer(text):
        if int(m.group(1)) >= depth:
            found.append(m.group(0))
    return found


def test_the_outside_reference_check_catches_what_it_should(tmp_path: Path):
    # the check itself, on made-up content placed at real depths of the repo
    deep = REPO / "tests" / "unit" / "x.py"
    top = REPO / "x.md"
    assert outside_references(deep, 'open("/wo' 'rk/contract.md")')
    assert outside_references(deep, 'Path(__file__).resolve()' '.parents[3] / "x"')
    assert not outside_references(deep, 'Path(__file__).resolve()' '.parents[2] / "x"')
    assert outside_references(top, "see [the contract](../" "shared/contract.md)")
    assert outside_references(top, "[x](../elsewhere/y.md)")
    assert not outside_references(top, "[x](docs/reference.md) /proc/self/status /usr/bin/promtool /tmp/x")
    assert not outside_references(REPO / "deploy" / "README.md", "[r](../docs/reference.md)")


def test_no_tracked_file_reads_outside_the_repo():
    files = _text_files()
    assert len(files) > 100  # a guard on the listing
    bad = {}
    for p in files:
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits = outside_references(p, text)
        if hits:
            bad[str(p.relative_to(REPO))] = hits
    assert not bad, f"files naming paths outside the repository: {bad}"


def test_license_is_the_apache_2_text():
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'license = "Apache-2.0"' in (REPO / "pyproject.toml").read_text(encoding="utf-8")


def _gen_script() -> list[str]:
    return [sys.executable, str(REPO / "scripts" / "gen_metrics_doc.py")]


def test_generated_metric_reference_is_current():
    r = subprocess.run([*_gen_script(), "--check"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_metric_reference_check_fails_on_a_stale_copy(tmp_path: Path):
    stale = tmp_path / "metrics.md"
    current = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    # a catalog change the document has not followed: one row missing
    stale.write_text("\n".join(line for line in current.splitlines() if "memprof_build_info" not in line) + "\n")
    r = subprocess.run([*_gen_script(), "--check", "--output", str(stale)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "stale" in r.stderr
    r = subprocess.run([*_gen_script(), "--output", str(stale)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and stale.read_text(encoding="utf-8") == current


def test_metric_reference_lists_every_catalog_entry_with_its_labels():
    from memprof_otel.metric_names import METRICS

    text = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip().strip("`"): line for line in text.splitlines()
            if line.startswith("| `memprof_")}
    assert set(rows) == {d.prom for d in METRICS}
    for d in METRICS:
        assert f"| {d.kind} |" in rows[d.prom]
        for label in d.labels:
            assert f"`{label}`" in rows[d.prom]


USER_DOCS = ["README.md", "docs/reference.md", "docs/design.md", "docs/benchmarks.md", "docs/metrics.md",
             "docs/capacity.md", "docs/testing.md",
             "docs/advice.md", "deploy/README.md", "grafana/README.md"]


@pytest.mark.parametrize("doc", USER_DOCS)
def test_user_docs_link_only_to_files_in_the_repo(doc: str):
    path = REPO / doc
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://|mailto:", target):
            continue  # a public web page, not a file
        file_part = target.split("#", 1)[0]
        if not file_part:
            continue  # an anchor in the same document
        assert _inside(path.parent / file_part) and (path.parent / file_part).exists(), (doc, target)


@pytest.mark.parametrize("doc", USER_DOCS)
def test_user_docs_speak_to_users(doc: str):
    text = (REPO / doc).read_text(encoding="utf-8")
    # no internal tracker numbers, no ignored output folder presented as if a user had it
    assert not re.search(r"\bissues? #?\d", text, re.I), doc
    assert not re.search(r"(?<![\w/.-])out/", text), doc
    assert not re.search(r"\bsession \d|\bseeds?'?\b", text, re.I), doc
