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

from tests.integration.support.bfc_rule import assert_held

REPO = Path(__file__).resolve().parents[2]
TF_PYTHON = os.environ.get("MEMPROF_TEST_TF_PYTHON")
if not TF_PYTHON:
    pytest.skip("MEMPROF_TEST_TF_PYTHON is not set (the interpreter with tensorflow-cpu that "
                "scripts/install-and-test.sh builds as .venv-tf)", allow_module_level=True)
# the test command may still be building it: the tests wait (tests/framework_venvs.py)
pytestmark = pytest.mark.framework_venv("tf")

F32 = 4
BATCH = 512
# TF_ENABLE_ONEDNN_OPTS: "1" is a CPU with AVX-512/AMX (TensorFlow keeps CPU statistics by default),
# "0" one without (it keeps none unless BFC is asked for)
CPU_KINDS = {"avx512": "1", "no_avx512": "0"}


def _child(mode: str, bfc: str | None, onednn: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPU_ALLOCATOR_USE_BFC", "TF_ENABLE_ONEDNN_OPTS")}
    env.update({"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"})
    if bfc is not None:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = bfc
    if onednn is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = onednn
    proc = subprocess.run([str(TF_PYTHON), str(REPO / "tests" / "integration" / "support" / "keras_tf_cpu_statistics_child.py"), mode],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and len(lines) == 1, proc.stderr[-4000:]
    out: dict[str, Any] = json.loads(lines[0].split(" ", 1)[1])
    return out


def _check_figures(r: dict[str, Any]) -> None:
    """Each Dense makes x @ kernel, then the bias-added copy while the first is alive (2x its output);
    it keeps its output: as BFC holds them."""
    assert set(r["stats"]) == {"", "d1", "d2"}
    for path, units in (("d1", 512), ("d2", 1024)):
        out_bytes = BATCH * units * F32
        s = r["stats"][path]
        assert s["calls"] == 3
        assert_held(s["peak_increase"], out_bytes, out_bytes, what=(path, s))
        assert_held(s["retained"], out_bytes, what=(path, s))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cpu", sorted(CPU_KINDS))
def test_imported_first_every_cpu_has_per_layer_figures_and_says_how(cpu: str) -> None:
    r = _child("import_first", None, CPU_KINDS[cpu])
    assert r["env"] == "true"
    assert r["figures"] == "tensorflow allocator statistics (TF_CPU_ALLOCATOR_USE_BFC=true, set by memprof-otel at import)"
    assert r["warnings"] == []
    _check_figures(r)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cpu", sorted(CPU_KINDS))
def test_tensorflow_started_first_has_figures_where_its_default_keeps_them_else_names_the_variable(
        cpu: str) -> None:
    r = _child("tf_first", None, CPU_KINDS[cpu])
    # the variable stands for the CPU kind: TensorFlow's default keeps statistics exactly where
    # oneDNN's optimisations are on (asked of TensorFlow before memprof_otel is imported)
    assert r["default_keeps_statistics"] is (cpu == "avx512"), r.get("error")
    assert r["forwards"] == 3  # counted either way
    if cpu == "avx512":  # TF's default allocator there is BFC
        _check_figures(r)
        return
    # this CPU's default keeps no statistics and TF made its device before memprof_otel set the variable
    assert r["stats"] == {}
    assert r["figures"].startswith("none: TensorFlow gives no memory figures for CPU:0 (")
    for text in (r["figures"], r["warnings"][0]):
        assert "set TF_CPU_ALLOCATOR_USE_BFC=true in the environment before the process starts" in text
    assert len(r["warnings"]) == 1


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cpu", sorted(CPU_KINDS))
def test_a_value_the_user_set_is_kept(cpu: str) -> None:
    r = _child("import_first", "false", CPU_KINDS[cpu])
    assert r["env"] == "false"
    if cpu == "avx512":
        _check_figures(r)
        assert r["figures"] == "tensorflow allocator statistics (TF_CPU_ALLOCATOR_USE_BFC=false, set by the environment)"
        return
    assert r["stats"] == {}
    assert "TF_CPU_ALLOCATOR_USE_BFC=false keeps TensorFlow's plain CPU allocator" in r["figures"]


@pytest.mark.timeout(300)
def test_this_cpu_takes_the_branch_of_its_kind() -> None:
    """TF_ENABLE_ONEDNN_OPTS decides whether TensorFlow keeps CPU statistics by default (checked by the
    ``tf_first`` cases above, which set it, so both kinds of CPU are covered); left unset, this CPU
    takes the branch its kind gives (-rA shows which)."""
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    avx512 = "avx512f" in flags
    default = bool(_child("probe", None, None)["default_keeps_statistics"])
    print(f"avx512f={avx512} tensorflow default keeps CPU statistics={default}")
    # oneDNN's optimisations are on by default only on CPUs with AVX-512 (AMX CPUs have it too), so
    # a CPU without avx512f must take the "no statistics" branch
    if flags and not avx512:
        assert not default
