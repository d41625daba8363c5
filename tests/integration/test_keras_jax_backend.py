"""Keras 3 models on the JAX backend get figures per Keras layer in eager mode; inside ``jax.jit``
and a (jitted) ``predict`` the model runs exactly as plain and nothing is measured per layer.

JAX is not in the test environment: the models run in a child process (``keras_jax_child.py``)
under the interpreter named by ``MEMPROF_TEST_JAX_PYTHON`` (``scripts/install-and-test.sh`` builds
``.venv-jax`` with ``jax[cpu]`` and sets it), with this repository on ``PYTHONPATH``. Without the
variable the module is skipped, saying so.

On CPU JAX keeps no allocator statistics: the figures are the sizes of the device's live arrays,
read at each layer boundary. What a layer keeps is then exact (no allocator rounding), and a
layer's peak is only the higher of its two ends (a lower bound). The expected figures below are
the arithmetic of the definitions' tensor sizes, written here, not read from our code.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.support.demo_process import REPO
from tests.schemas import validate_speedscope
from tests.integration.support import keras_checks as kc

JAX_PYTHON = os.environ.get("MEMPROF_TEST_JAX_PYTHON")
if not JAX_PYTHON:
    pytest.skip("MEMPROF_TEST_JAX_PYTHON is not set (the interpreter with jax[cpu] and keras that "
                "scripts/install-and-test.sh builds as .venv-jax)", allow_module_level=True)
# the test command may still be building it: the tests wait (tests/framework_venvs.py)
pytestmark = pytest.mark.framework_venv("jax")

MIB = 1 << 20


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    """Every section of one child run (live-array sizes carry nothing from one case to the next)."""
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([str(JAX_PYTHON), str(Path(REPO) / "tests" / "integration" / "support" / "keras_jax_child.py")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out: dict[str, Any] = {}
    for line in proc.stdout.splitlines():
        tag, _, body = line.partition(" ")
        if tag == "RESULT":
            data = json.loads(body)
            out[data["case"]] = data
        elif tag in ("BEHAVIOUR", "COUNTER", "VERSIONS"):
            out[tag.lower()] = json.loads(body)
    assert set(out) == {*kc.EXPECTED, "behaviour", "counter", "versions"}, proc.stderr[-4000:]
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(kc.EXPECTED))
def test_dense_retained_is_its_output_exactly_and_peak_at_least_that(results: dict[str, Any], case: str) -> None:
    r = results[case]
    for path, units in r["dense_units"].items():
        out_bytes = r["batch"] * units * kc.F32
        s = r["stats"][path]
        assert s["retained"] == out_bytes, (path, s)
        # x @ kernel and the bias added to it are two arrays, but the first is gone by the layer's
        # end: the peak is a lower bound, never below what the layer keeps
        assert s["peak_increase"] >= out_bytes, (path, s)
    # a model (and a nested one) keeps exactly its output: no slack, live arrays are exact sizes
    kc.check_models_keep_their_outputs(r, case)


@pytest.mark.timeout(300)
def test_a_root_peak_is_the_outputs_alive_together_at_a_boundary(results: dict[str, Any]) -> None:
    # Sequential: at the end of inner.act, d1's 4096-wide output, inner.d_in's 1024-wide one (the
    # Sequential still holds it as its running value) and act's 1024-wide one are all alive
    s = results["sequential"]["stats"][""]
    assert s["peak_increase"] == 256 * (4096 + 1024 + 1024) * kc.F32
    # functional: d (2048), hid (1024) and submodel.d (4096) all alive at submodel.d's end
    assert results["functional"]["stats"][""]["peak_increase"] == 256 * (2048 + 1024 + 4096) * kc.F32


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(kc.EXPECTED))
def test_each_layer_is_measured_under_its_path_and_the_model_is_left_as_it_was(results: dict[str, Any],
                                                                               case: str) -> None:
    kc.check_paths_and_calls(results[case], case, "jax live arrays; retained exact, peak a lower bound")
    kc.check_outputs_and_layers_as_before(results[case], case)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(kc.EXPECTED))
def test_jit_and_predict_run_the_plain_model_and_are_not_measured_per_layer(results: dict[str, Any],
                                                                         case: str) -> None:
    r = results[case]
    j = r["jit"]
    assert j["bit_identical_to_plain_jit"] and j["plain_jit_bit_identical"]
    assert j["forwards_added"] == 0
    assert set(j["calls_added"].values()) == {0}
    assert set(r["predict_calls_added"].values()) == {0}
    assert r["predict_bit_identical"]
    assert r["forwards_after_jit_and_predict"] == kc.FORWARDS
    # run_eagerly=True: the model is called eagerly per batch (4 of BATCH // 4 rows), each measured
    assert set(r["eager_predict_calls_added"].values()) == {4}
    assert r["eager_predict_allclose"]


@pytest.mark.timeout(300)
def test_the_endpoint_shows_the_keras_paths(results: dict[str, Any]) -> None:
    kc.check_endpoint_paths(results["sequential"])


@pytest.mark.timeout(300)
def test_a_capture_weighs_each_innermost_layer_call_in_python_and_over_http(results: dict[str, Any]) -> None:
    r = results["sequential"]
    validate_speedscope(r["capture_speedscope"])
    validate_speedscope(r["dump_speedscope"])
    kc.check_captures(r)


@pytest.mark.timeout(300)
def test_the_child_never_imported_torch_or_tensorflow(results: dict[str, Any]) -> None:
    v = results["versions"]
    assert v["torch_imported"] is False and v["tensorflow_imported"] is False
    assert v["keras"].startswith("3.")


@pytest.mark.timeout(300)
def test_the_cpu_counter_reads_live_array_sizes_and_its_peak_is_a_lower_bound(results: dict[str, Any]) -> None:
    c = results["counter"]
    base = c["r0"][0]
    # Reading(allocated, reserved, peak, allocations, frees, fragmentation, reserved_peak): a 4 MiB
    # array kept, a second one made and freed between two reads
    allocated, reserved, peak, allocations, frees, fragmentation = c["r1"][:6]
    assert allocated - base == 4 * MIB
    assert reserved == allocated
    # the freed 4 MiB is not seen: the peak is the higher end of the window, 4 MiB below the truth
    assert peak == allocated and c["lower_bound"] is True
    assert (allocations, frees, fragmentation) == (0, 0, None)
    assert c["r2"][0] == c["r2"][2] == allocated
    # the kept array freed: the level is back, the window's peak is where it started
    assert c["r3"][0] == base and c["r3"][2] == allocated


@pytest.mark.timeout(300)
def test_a_trace_is_told_from_an_eager_call_both_ways(results: dict[str, Any]) -> None:
    c = results["counter"]
    # the check in use and the fallback for a JAX without it agree, outside and inside jax.jit
    assert c["eager_outside"] == [True, True]
    assert c["eager_inside_jit"] == [False, False]
    assert c["check"] == "trace_state_clean"


@pytest.mark.timeout(300)
def test_overlapping_forwards_are_dropped_and_a_failing_one_is_counted(results: dict[str, Any]) -> None:
    # live arrays are the device's too: the threads' forwards cannot be told apart
    b = results["behaviour"]
    kc.check_overlapping_forwards_dropped(b)
    # the one forward that ran alone: its Dense(1024) kept its output, batch 256, exactly
    assert b["after_threads"]["stats"]["fc"]["retained"] == 256 * 1024 * kc.F32
    kc.check_failed_forward_counted_and_own_call_back(b)


@pytest.mark.timeout(300)
def test_a_nested_model_called_on_its_own_is_a_forward_rooted_at_its_path(results: dict[str, Any]) -> None:
    kc.check_direct_call(results["sequential"])
