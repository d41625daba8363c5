"""Keras 3 models on the TensorFlow backend get figures per Keras layer in eager mode, from
TensorFlow's own allocator statistics; inside a ``tf.function`` or a compiled ``predict`` the model
runs exactly as plain.

TensorFlow is not in the test environment (it pins its own numpy and protobuf): the models run in a
child process (``keras_tf_child.py``) under the interpreter named by ``MEMPROF_TEST_TF_PYTHON``
(``scripts/install-and-test.sh`` builds ``.venv-tf`` with ``tensorflow-cpu`` and sets it), with
this repository on ``PYTHONPATH``. Without the variable the module is skipped, saying so.

Three models: a Sequential with a nested Sequential, a functional model calling a nested functional
model (a layer named ``d`` in each), and a subclassed model with layers in a list and custom layers
holding a sublayer (``keras_cases.py``, shared with the JAX test). Checked: the layer paths
(written in ``keras_checks.py`` from the model definitions), each Dense layer's figures against the sizes of its tensors, bit-identical
outputs, a ``tf.function`` that is neither traced again nor measured per layer, nothing left on the
layers after ``uninstrument()``, the endpoint's ``/metrics``, and no torch in the child.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.support.bfc_rule import assert_held, held_bounds
from tests.integration.support.demo_process import REPO
from tests.schemas import validate_speedscope
from tests.integration.support.keras_checks import (EXPECTED, F32, check_captures, check_direct_call, check_endpoint_paths,
                                            check_failed_forward_counted_and_own_call_back,
                                            check_models_keep_their_outputs, check_outputs_and_layers_as_before,
                                            check_overlapping_forwards_dropped, check_paths_and_calls)

TF_PYTHON = os.environ.get("MEMPROF_TEST_TF_PYTHON")
if not TF_PYTHON:
    pytest.skip("MEMPROF_TEST_TF_PYTHON is not set (the interpreter with tensorflow-cpu that "
                "scripts/install-and-test.sh builds as .venv-tf)", allow_module_level=True)
# the test command may still be building it: the tests wait (tests/framework_venvs.py)
pytestmark = pytest.mark.framework_venv("tf")

MIB = 1 << 20
# TF counts what its allocator holds for a request, not the tensor's size: BFC's chunks, from the
# tensor's size (rounded to 256 B) to nearly twice it where a free chunk of under twice the request
# is about (bfc_rule.py). Which happens varies with the CPU and the process's history, so each figure
# is checked against those bounds: a missing or a doubled tensor still fails.
#
# TensorFlow's own choice of kernels and allocator differs by CPU: where oneDNN's optimisations are
# on (its default on CPUs with AVX-512 or AMX) it picks BFC itself and runs oneDNN's kernels; where
# they are off (its default elsewhere) memprof-otel's TF_CPU_ALLOCATOR_USE_BFC=true picks BFC, with
# TF's own kernels. TF_ENABLE_ONEDNN_OPTS, which TF reads, sets the branch, so each case says which
# it runs on and both run on any CPU, whichever this one is.
ONEDNN = {"sequential": "1", "functional": "0", "subclassed": "1", "behaviour": "0", "counter": "1"}


def _child(section: str) -> dict[str, Any]:
    """Run one section of keras_tf_child.py in a process of its own and return its JSON line.

    One process per section: blocks an earlier section left behind in TF's allocator would make a
    later tensor's chunk larger than need be (a 4 MiB tensor counted as a 7 MiB block, measured when
    all sections shared one process)."""
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2",
           "TF_ENABLE_ONEDNN_OPTS": ONEDNN[section]}
    proc = subprocess.run([str(TF_PYTHON), str(Path(REPO) / "tests" / "integration" / "support" / "keras_tf_child.py"), section],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    tags = ("RESULT ", "BEHAVIOUR ", "COUNTER ")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(tags)]
    assert proc.returncode == 0 and len(lines) == 1, proc.stderr[-4000:]
    versions = [line for line in proc.stdout.splitlines() if line.startswith("VERSIONS ")]
    out: dict[str, Any] = json.loads(lines[0].split(" ", 1)[1])
    out["versions"] = json.loads(versions[0].split(" ", 1)[1])
    return out


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    """Every case, the behaviour section and the counter section (importing TF takes seconds each)."""
    return {section: _child(section) for section in [*sorted(EXPECTED), "behaviour", "counter"]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_every_keras_layer_has_its_path_and_every_eager_call_counts(results: dict[str, Any], case: str) -> None:
    check_paths_and_calls(results[case], case, "tensorflow allocator statistics")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_dense_figures_are_the_sizes_of_its_tensors(results: dict[str, Any], case: str) -> None:
    r = results[case]
    for path, units in r["dense_units"].items():
        out_bytes = r["batch"] * units * F32
        s = r["stats"][path]
        # a Dense without activation makes x @ kernel, then adds the bias into a second tensor of
        # the same size while the first is alive; it returns the second
        assert_held(s["peak_increase"], out_bytes, out_bytes, what=(path, "peak"))
        assert_held(s["retained"], out_bytes, what=(path, "retained"))
    check_models_keep_their_outputs(r, case, held_bounds)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_outputs_are_bit_identical_and_uninstrument_leaves_the_layers_as_before(results: dict[str, Any],
                                                                               case: str) -> None:
    check_outputs_and_layers_as_before(results[case], case)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_tf_function_runs_the_plain_graph_and_is_not_measured_per_layer(results: dict[str, Any],
                                                                         case: str) -> None:
    f = results[case]["tf_function"]
    # traced once for three calls of one shape: the wrappers add no retrace
    assert f["tracing_count"] == 1
    assert f["bit_identical_to_plain_graph"]
    # a function traced before instrument() is not traced again and gives the same result
    assert f["plain_fn_tracing_count"] == f["plain_fn_tracing_count_after"] == 1
    assert f["plain_fn_bit_identical"]
    # the graph runs without Python: no forward, no layer call is seen
    assert f["forwards_added"] == 0
    assert set(f["calls_added"].values()) == {0}
    assert set(results[case]["predict_calls_added"].values()) == {0}
    assert results[case]["predict_allclose"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_predict_run_eagerly_is_measured_per_batch(results: dict[str, Any], case: str) -> None:
    # 4 batches of BATCH // 4 rows: every layer called once per batch
    assert set(results[case]["eager_predict_calls_added"].values()) == {4}
    assert results[case]["eager_predict_allclose"]


@pytest.mark.timeout(300)
def test_the_endpoint_shows_the_keras_paths(results: dict[str, Any]) -> None:
    check_endpoint_paths(results["sequential"])


@pytest.mark.timeout(300)
def test_a_capture_weighs_each_innermost_layer_call_in_python_and_over_http(results: dict[str, Any]) -> None:
    r = results["sequential"]
    validate_speedscope(r["capture_speedscope"])
    validate_speedscope(r["dump_speedscope"])
    # a capture weighs peak increases: BFC's chunks, as the figures
    check_captures(r, held_bounds)


@pytest.mark.timeout(300)
def test_the_child_never_imported_torch(results: dict[str, Any]) -> None:
    for section in results.values():
        assert section["versions"]["torch_imported"] is False
        assert section["versions"]["tensorflow"].startswith("2.")


@pytest.mark.timeout(300)
def test_forwards_that_overlap_are_dropped_not_published_wrong(results: dict[str, Any]) -> None:
    check_overlapping_forwards_dropped(results["behaviour"])
    out_bytes = 256 * 1024 * F32  # the one published forward's Dense(1024), batch 256
    peak = results["behaviour"]["after_threads"]["stats"]["fc"]["peak_increase"]
    assert_held(peak, out_bytes, out_bytes)


@pytest.mark.timeout(300)
def test_a_forward_that_raises_is_counted_and_an_own_instance_call_comes_back(results: dict[str, Any]) -> None:
    check_failed_forward_counted_and_own_call_back(results["behaviour"])


@pytest.mark.timeout(300)
def test_the_counter_reads_level_and_peak_since_its_last_read(results: dict[str, Any]) -> None:
    c = results["counter"]
    base = c["r0"][0]
    # Reading(allocated, reserved, peak, allocations, frees, fragmentation): a 4 MiB tensor kept,
    # a second one made and freed in between
    allocated, reserved, peak, allocations, frees, fragmentation = c["r1"][:6]
    assert_held(allocated - base, 4 * MIB)
    assert reserved == allocated  # TF reports no reserved figure: its level stands for it
    assert_held(peak - base, 4 * MIB, 4 * MIB)
    assert (allocations, frees, fragmentation) == (0, 0, None)
    # the read reset the peak: the next window, with nothing done, peaks at the level
    assert c["r2"][2] == c["r2"][0] == allocated
    # the kept tensor freed: the level is back, the window's peak is the level it started at
    assert c["r3"][0] == base and c["r3"][2] == allocated


@pytest.mark.timeout(300)
def test_a_nested_model_called_on_its_own_is_a_forward_rooted_at_its_path(results: dict[str, Any]) -> None:
    check_direct_call(results["sequential"])


@pytest.mark.timeout(300)
def test_a_plain_tf_module_is_refused_saying_why_and_what_to_do(results: dict[str, Any]) -> None:
    r = results["behaviour"]["tf_module"]
    assert r["error"] is not None and "a tf.Module that is no Keras model" in r["error"]
    assert "mp.operation()" in r["error"]
    assert r["output"] == 6.0  # refused without touching it
