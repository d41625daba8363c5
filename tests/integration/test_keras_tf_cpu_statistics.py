"""Keras on TensorFlow has per-layer figures on every x86-64 CPU, with or without AVX-512.

TensorFlow keeps CPU allocator statistics only with its BFC allocator, its default only where oneDNN's
optimisations are on by default (AVX-512/AMX). ``import memprof_otel`` sets
``TF_CPU_ALLOCATOR_USE_BFC=true`` where unset; where TensorFlow created its CPU device before that, the
status and the warning name the variable. Which of the two branches the CPU takes by default is
asked of TensorFlow itself (``probe``), and each test checks the branch it is on: on a CPU without
AVX-512 the "no statistics" branch, elsewhere the figures TensorFlow keeps by default.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TF_PYTHON = os.environ.get("MEMPROF_TEST_TF_PYTHON")
if not TF_PYTHON:
    pytest.skip("MEMPROF_TEST_TF_PYTHON is not set (the interpreter with tensorflow-cpu that "
                "scripts/install-and-test.sh builds as .venv-tf)", allow_module_level=True)
# the test command may still be building it: the tests wait (tests/framework_venvs.py)
pytestmark = pytest.mark.framework_venv("tf")

F32 = 4
BATCH = 512
SLACK = 32 * 1024  # TF's block rounding, as in test_keras_tensorflow_backend.py


def _child(mode: str, bfc: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    env.update({"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"})
    if bfc is not None:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = bfc
    proc = subprocess.run([str(TF_PYTHON), str(REPO / "tests" / "integration" / "keras_tf_cpu_statistics_child.py"), mode],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and len(lines) == 1, proc.stderr[-4000:]
    out: dict[str, Any] = json.loads(lines[0].split(" ", 1)[1])
    return out


@pytest.fixture(scope="module")
def default_keeps_statistics() -> bool:
    """Whether this CPU's TensorFlow keeps CPU statistics with the variable unset."""
    return bool(_child("probe", None)["default_keeps_statistics"])


def _check_exact_figures(r: dict[str, Any]) -> None:
    """Each Dense makes x @ kernel, then the bias-added copy while the first is alive (2x its output);
    it keeps its output."""
    assert set(r["stats"]) == {"", "d1", "d2"}
    for path, units in (("d1", 512), ("d2", 1024)):
        out_bytes = BATCH * units * F32
        s = r["stats"][path]
        assert s["calls"] == 3
        assert 2 * out_bytes <= s["peak_increase"] <= 2 * out_bytes + 2 * SLACK, (path, s)
        assert out_bytes <= s["retained"] <= out_bytes + SLACK, (path, s)


@pytest.mark.timeout(300)
def test_imported_first_every_cpu_has_exact_per_layer_figures_and_says_how() -> None:
    r = _child("import_first", None)
    assert r["env"] == "true"
    assert r["figures"] == "tensorflow allocator statistics (TF_CPU_ALLOCATOR_USE_BFC=true, set by memprof-otel at import)"
    assert r["warnings"] == []
    _check_exact_figures(r)


@pytest.mark.timeout(300)
def test_tensorflow_started_first_has_figures_where_its_default_keeps_them_else_names_the_variable(
        default_keeps_statistics: bool) -> None:
    r = _child("tf_first", None)
    assert r["forwards"] == 3  # counted either way
    if default_keeps_statistics:  # a CPU with AVX-512/AMX: TF's default allocator is BFC
        _check_exact_figures(r)
        return
    # this CPU's default keeps no statistics and TF made its device before memprof_otel set the variable
    assert r["stats"] == {}
    assert r["figures"].startswith("none: TensorFlow gives no memory figures for CPU:0 (")
    for text in (r["figures"], r["warnings"][0]):
        assert "set TF_CPU_ALLOCATOR_USE_BFC=true in the environment before the process starts" in text
    assert len(r["warnings"]) == 1


@pytest.mark.timeout(300)
def test_a_value_the_user_set_is_kept(default_keeps_statistics: bool) -> None:
    r = _child("import_first", "false")
    assert r["env"] == "false"
    if default_keeps_statistics:
        _check_exact_figures(r)
        assert r["figures"] == "tensorflow allocator statistics (TF_CPU_ALLOCATOR_USE_BFC=false, set by the environment)"
        return
    assert r["stats"] == {}
    assert "TF_CPU_ALLOCATOR_USE_BFC=false keeps TensorFlow's plain CPU allocator" in r["figures"]


def test_this_cpu_is_named_for_the_record(default_keeps_statistics: bool) -> None:
    """Not a check of ours: says which branch the TF tests above took on this machine (-rA shows it)."""
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    avx512 = "avx512f" in flags
    print(f"avx512f={avx512} tensorflow default keeps CPU statistics={default_keeps_statistics}")
    # TF keeps them by default exactly where oneDNN's optimisations are on by default; on x86-64 that
    # needs AVX-512 (AMX CPUs have it too), so a CPU without avx512f must take the "no statistics" branch
    if flags and not avx512:
        assert not default_keeps_statistics
