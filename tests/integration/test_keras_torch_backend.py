"""Keras 3 models on the torch backend get figures per Keras layer, exact against the reference.

Keras keeps most of its layers out of ``named_modules()`` (in a Sequential, a functional graph, a
Python list), so the paths come from Keras's own layer tree. Three models, each run in a child
process with ``KERAS_BACKEND=torch`` (``keras_torch_child.py``; keras is never imported here, where
its backend choice would last for the whole test session):

* a Sequential with a nested Sequential;
* a functional model calling a nested functional model, a layer named ``d`` in each;
* a subclassed model with layers as attributes and in a list, custom layers with a sublayer, and a
  layer whose Keras name has a dot.

For each: the layer paths are the ones written below from the model definitions; the library's
``layer_exit`` events equal, call by call, those of the independent reference ledger run beside it
(``reference_ledger.py``, told the same paths by hand); Dense layers retain exactly their output
(batch x units x 4 bytes); outputs are bit-identical to an uninstrumented model's.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from typing import Any

import pytest

from tests.integration.support.demo_process import REPO
from tests.schemas import validate_speedscope

if importlib.util.find_spec("keras") is None:  # the dev extra installs it
    pytest.skip("keras is not installed (pip install 'memprof-otel[dev]')", allow_module_level=True)

F32 = 4

# the paths each model's definition gives (keras_torch_child.py), as model.summary(expand_nested=True)
# shows the layers, joined with "." (and going on into custom layers, which summary() does not)
EXPECTED = {
    "sequential": {"", "d1", "inner", "inner.d_in", "inner.act"},
    "functional": {"", "d", "submodel", "submodel.hid", "submodel.d"},
    "subclassed": {"", "stem", "block_a", "block_a.fc", "block_b", "block_b.fc", "head_out"},
}
FORWARDS = 2


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    """One child process runs every case (importing keras with torch takes seconds)."""
    proc = subprocess.run([sys.executable, "-m", "tests.integration.support.keras_torch_child"], cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and len(lines) == len(EXPECTED), proc.stderr[-4000:]
    out = {}
    for line in lines:
        r = json.loads(line[len("RESULT "):])
        out[r["case"]] = r
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_every_keras_layer_has_its_path(results: dict[str, dict[str, Any]], case: str) -> None:
    r = results[case]
    assert set(r["stats"]) == EXPECTED[case]
    # torch's own module walk would have missed some of them: the case needs Keras's tree
    assert not EXPECTED[case] <= set(r["named_modules"])
    assert all(s["calls"] == FORWARDS for s in r["stats"].values())
    # the handle's id(layer) -> path (the OOM recorder's failing layer) names the same layers
    assert r["object_paths"] == {p: p for p in EXPECTED[case]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_figures_equal_the_reference_call_by_call(results: dict[str, dict[str, Any]], case: str) -> None:
    r = results[case]
    ref = [tuple(c) for c in r["reference"]]
    assert not r["reference_unclosed"]
    # the reference, told the paths by hand, saw every layer called on every forward
    assert {c[0] for c in ref} == EXPECTED[case]
    assert len(ref) == FORWARDS * len(EXPECTED[case])
    why = f"reference saw storages born outside the dispatcher: {r['reference_born_outside_dispatch']}"
    assert [tuple(c) for c in r["library"]] == ref, why
    # and the library alone (no reference beside it) measures the same
    assert [tuple(c) for c in r["library_alone"]] == ref


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_dense_layers_retain_their_output(results: dict[str, dict[str, Any]], case: str) -> None:
    r = results[case]
    assert r["dense_units"]
    for path, units in r["dense_units"].items():
        out_bytes = r["batch"] * units * F32  # float32 [batch, units]
        s = r["stats"][path]
        assert s["retained"] == out_bytes, path  # the output is all a Dense call leaves alive
        assert s["peak_increase"] >= out_bytes, path
    # the root holds at least what its last layer returns, and saw every layer's peak
    assert r["stats"][""]["peak_increase"] >= max(s["peak_increase"] for s in r["stats"].values())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_outputs_are_bit_identical(results: dict[str, dict[str, Any]], case: str) -> None:
    r = results[case]
    assert r["bit_identical"] and r["bit_identical_alone"] and r["bit_identical_after"]


@pytest.mark.timeout(300)
def test_the_endpoint_shows_the_keras_paths(results: dict[str, dict[str, Any]]) -> None:
    r = results["sequential"]
    assert set(r["http_layers"]) == EXPECTED["sequential"]
    for path in EXPECTED["sequential"]:
        line = (f'memprof_layer_retained_bytes{{device="cpu",layer="{path}",model="sequential"}} '
                f'{float(r["stats"][path]["retained"])}')
        assert line in r["metrics"].splitlines(), line


@pytest.mark.timeout(300)
def test_a_deep_capture_names_the_keras_paths_and_their_allocations(results: dict[str, dict[str, Any]]) -> None:
    r = results["sequential"]
    assert r["capture_done"] is True
    doc = r["capture_speedscope"]
    validate_speedscope(doc)
    names = {f["name"] for f in doc["shared"]["frames"]}
    assert EXPECTED["sequential"] - {""} <= names, sorted(names)
    # each Dense allocates at least its float32 output there: batch x units x 4 bytes
    for path, units in r["dense_units"].items():
        assert r["capture_bytes_by_layer"][path] >= r["batch"] * units * F32, (path, r["capture_bytes_by_layer"])


@pytest.mark.timeout(300)
def test_predict_attributes_every_batch_and_keeps_its_outputs(results: dict[str, dict[str, Any]]) -> None:
    r = results["sequential"]
    assert r["predict_calls"] == {p: 2 for p in EXPECTED["sequential"]}  # two batches
    assert r["predict_bit_identical"]


@pytest.mark.timeout(300)
def test_a_layer_called_on_its_own_opens_its_own_forward(results: dict[str, dict[str, Any]]) -> None:
    r = results["sequential"]
    assert r["direct_calls"] == {"": 0, "d1": 0, "inner": 1, "inner.d_in": 1, "inner.act": 1}


@pytest.mark.timeout(300)
def test_max_depth_cuts_the_keras_tree_and_folds_deeper_layers_into_their_parent(
        results: dict[str, dict[str, Any]]) -> None:
    r = results["sequential"]
    shallow = r["max_depth_1"]
    assert set(shallow) == {"", "d1", "inner"}
    for path in shallow:  # inner's layers count in inner: its figures are the full tree's
        assert (shallow[path]["peak_increase"], shallow[path]["retained"]) == \
            (r["stats"][path]["peak_increase"], r["stats"][path]["retained"]), path
