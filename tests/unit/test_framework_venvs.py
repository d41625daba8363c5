"""The suite's own scheduling (tests/framework_venvs.py): tests that need a side venv wait for the
build the test command runs meanwhile, fail with its log when it failed, and the files go out
longest first."""
from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import pytest

from tests import framework_venvs as fv

REPO = Path(__file__).resolve().parents[2]


def test_without_a_build_going_on_nothing_waits(tmp_path: Path):
    t0 = time.monotonic()
    fv.wait_for_build("tf", environ={}, limit_s=30)
    assert time.monotonic() - t0 < 1.0


def test_a_test_waits_until_its_venv_is_built(tmp_path: Path):
    def finish() -> None:  # as the script does: the status written whole, by a rename
        (tmp_path / "tf.log").write_text("installed\n")
        (tmp_path / "tf.status.part").write_text("0\n")
        (tmp_path / "tf.status.part").rename(tmp_path / "tf.status")

    timer = threading.Timer(0.6, finish)
    timer.start()
    t0 = time.monotonic()
    try:
        fv.wait_for_build("tf", environ={fv.BUILDS_VAR: str(tmp_path)}, limit_s=30, poll_s=0.05)
    finally:
        timer.cancel()
    assert time.monotonic() - t0 >= 0.6


def test_a_failed_build_is_reported_with_the_end_of_its_log(tmp_path: Path):
    (tmp_path / "ray.log").write_text("".join(f"line {i}\n" for i in range(100)) + "pip: no such version\n")
    (tmp_path / "ray.status").write_text("1\n")
    with pytest.raises(fv.VenvBuildFailed) as e:
        fv.wait_for_build("ray", environ={fv.BUILDS_VAR: str(tmp_path)})
    msg = str(e.value)
    assert msg.startswith("building .venv-ray failed (exit 1)") and msg.endswith("pip: no such version")
    assert "line 99" in msg and "line 70" not in msg  # the last 30 lines of the log


def test_a_build_that_never_ends_is_reported_at_the_limit(tmp_path: Path):
    (tmp_path / "jax.log").write_text("Collecting jax\n")
    now = [0.0]

    def sleep(s: float) -> None:  # a clock of its own: the limit without the wait
        now[0] += s

    with pytest.raises(fv.VenvBuildFailed) as e:
        fv.wait_for_build("jax", environ={fv.BUILDS_VAR: str(tmp_path)}, limit_s=60, poll_s=1.0,
                          sleep=sleep, clock=lambda: now[0])
    assert str(e.value) == ".venv-jax was not built within 60 s:\nCollecting jax"
    assert now[0] == 60.0


def test_the_long_files_then_those_that_need_a_side_venv_go_first_in_their_order_and_the_rest_keep_theirs():
    first, side = fv.FIRST[0], fv.SIDE_VENV_FILES[0]
    collected = [fv.SIDE_VENV_FILES[1], "tests/unit/a.py", "tests/unit/a.py", fv.FIRST[2], side, "tests/unit/b.py",
                 first, first]
    order = fv.file_order(collected)
    assert [collected[i] for i in order] == [first, first, fv.FIRST[2], side, fv.SIDE_VENV_FILES[1],
                                             "tests/unit/a.py", "tests/unit/a.py", "tests/unit/b.py"]
    assert order[:2] == [6, 7] and order[5:7] == [1, 2]  # a file's items keep their own order


def _marked_venv(path: Path) -> str | None:
    """The venv a test module names with ``pytestmark = pytest.mark.framework_venv(NAME)``."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
                and isinstance(node.value, ast.Call) and getattr(node.value.func, "attr", None) == fv.MARKER):
            return ast.literal_eval(node.value.args[0])
    return None


def test_every_listed_file_exists_and_the_files_that_need_a_side_venv_come_after_the_long_ones():
    listed = fv.FIRST + fv.SIDE_VENV_FILES
    assert all((REPO / path).is_file() for path in listed), [p for p in listed if not (REPO / p).is_file()]
    assert len(set(listed)) == len(listed)
    marked = {path.relative_to(REPO).as_posix(): _marked_venv(path) for path in (REPO / "tests").rglob("test_*.py")}
    marked = {path: venv for path, venv in marked.items() if venv is not None}
    # the modules that read an interpreter of a side venv are the ones marked, with that venv
    reads = {"MEMPROF_TEST_TF_PYTHON": "tf", "MEMPROF_TEST_JAX_PYTHON": "jax",
             "MEMPROF_TEST_LITSERVE_PYTHON": "serve", "MEMPROF_TEST_RAY_PYTHON": "serve"}
    for path in (REPO / "tests" / "integration").glob("test_*.py"):
        text = path.read_text(encoding="utf-8")
        used = {venv for var, venv in reads.items() if f'environ.get("{var}")' in text}
        assert used == ({marked[path.relative_to(REPO).as_posix()]} if path.relative_to(REPO).as_posix() in marked
                        else set()), path
    # they are the files that go out right after the long ones: their venvs get the long files' time
    # to build
    assert set(marked) == set(fv.SIDE_VENV_FILES)
    assert fv.FIRST[0] == "tests/integration/test_oom_cgroup.py"
