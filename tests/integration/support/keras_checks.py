"""What the Keras backend tests (TensorFlow, JAX) check alike on their children's records: the
paths each model's definition gives, the calls counted, the models' kept outputs, the layers left
as they were, and the endpoint. The figures expected are written from the definitions
(``keras_cases.py``): batch x units x 4 bytes (float32)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

F32 = 4
FORWARDS = 2  # eager forwards each child runs per case (keras_child_common.FORWARDS)

# the paths each model's definition gives (keras_cases.py), joined with "."
EXPECTED = {
    "sequential": {"", "d1", "inner", "inner.d_in", "inner.act"},
    "functional": {"", "d", "submodel", "submodel.hid", "submodel.d"},
    "subclassed": {"", "stem", "block_a", "block_a.fc", "block_b", "block_b.fc", "head_out"},
}
# the layer whose output each model (and nested model) returns, and its width
OUTPUT_UNITS = {"sequential": {"": 1024, "inner": 1024}, "functional": {"": 4096, "submodel": 4096},
                "subclassed": {"": 2048, "block_a": 1024, "block_b": 2048}}


def check_paths_and_calls(r: dict[str, Any], case: str, method: str) -> None:
    """Every layer of the definition under its path, called once per eager forward, all attributed."""
    assert set(r["stats"]) == EXPECTED[case]
    assert all(s["calls"] == FORWARDS for s in r["stats"].values())
    assert r["forwards"] == FORWARDS and r["unattributed"] == {}
    assert r["device"] == "cpu"
    assert r["method"] == method


# (least, most) bytes a backend's allocator holds for tensors of these sizes alive at one time: a
# backend that counts tensors gives their sum (this); TensorFlow's BFC counts its chunks (bfc_rule.py)
HeldBounds = Callable[..., tuple[int, int]]


def exact_bounds(*tensor_bytes: int) -> tuple[int, int]:
    """The tensors' own sizes: what the JAX backend counts."""
    return sum(tensor_bytes), sum(tensor_bytes)


def check_models_keep_their_outputs(r: dict[str, Any], case: str, held: HeldBounds = exact_bounds) -> None:
    """A model (and a nested one) keeps its output, as the allocator holds it; its peak covers each
    of its layers'."""
    for path, units in OUTPUT_UNITS[case].items():
        least, most = held(r["batch"] * units * F32)
        assert least <= r["stats"][path]["retained"] <= most, path
        below = [p for p in EXPECTED[case] if p != path and (path == "" or p.startswith(path + "."))]
        assert r["stats"][path]["peak_increase"] >= max(r["stats"][p]["peak_increase"] for p in below)


def check_outputs_and_layers_as_before(r: dict[str, Any], case: str) -> None:
    """Bit-identical outputs while and after; pause() takes every wrapper off, resume() puts one on
    each tracked layer again, uninstrument() leaves no instance ``call``."""
    assert r["bit_identical"] and r["bit_identical_after"]
    assert r["paused_instance_calls"] == 0
    assert r["resumed_instance_calls"] == len(EXPECTED[case])
    assert r["instance_calls_after"] == []


def check_endpoint_paths(r: dict[str, Any]) -> None:
    """The Sequential case's paths in ``/v1/layers`` and in ``/metrics``."""
    assert set(r["http_layers"]) == EXPECTED["sequential"]
    for path in EXPECTED["sequential"]:
        line = f'memprof_layer_peak_increase_bytes{{device="cpu",layer="{path}",model="sequential"}}'
        assert line in r["metrics"], path


def check_overlapping_forwards_dropped(b: dict[str, Any]) -> None:
    """One forward alone, then 2 threads x 3 forwards held together inside the model (a barrier
    layer): the backends' figures are the device's, so none of those 6 can be attributed."""
    after = b["after_threads"]
    assert after["status"]["forwards"] == 7
    assert after["unattributed"] == {"concurrent": 6}
    assert {s["calls"] for s in after["stats"].values()} == {1}


def check_failed_forward_counted_and_own_call_back(b: dict[str, Any]) -> None:
    """A forward that raises: the model's own exception, counted; the model runs on; a layer's
    instance ``call`` set before instrument() is back after uninstrument()."""
    assert b["raised"] is True
    after = b["after_failure"]
    assert after["status"]["forward_errors"] == 1 and after["status"]["hook_errors"] == 0
    assert after["status"]["forwards"] == 9
    # the failed forward and the one after it are both attributed (the failure's layers flagged raised)
    assert {s["calls"] for s in after["stats"].values()} == {3}
    assert b["own_call_restored"] is True


# the Sequential case's innermost layers: a capture weighs these calls and no others
INNERMOST = {"sequential": {"d1", "inner.d_in", "inner.act"}}


def _weighed(doc: dict[str, Any]) -> dict[tuple[str, ...], int]:
    """The sampled profile of a speedscope document: stack of frame names -> weight."""
    names = [f["name"] for f in doc["shared"]["frames"]]
    prof = doc["profiles"][0]
    return {tuple(names[i] for i in s): w for s, w in zip(prof["samples"], prof["weights"])}


def check_captures(r: dict[str, Any], held: HeldBounds = exact_bounds) -> None:
    """A capture of the Sequential case, in Python and over HTTP: each innermost layer call under
    its Keras path, weighed by its peak increase: at least the Dense's float32 output (batch x
    units x 4 bytes) and at most its two results (the product and the bias added) alive together,
    as the backend's allocator holds them (``held``)."""
    assert r["capture_done"] is True
    doc = r["capture_speedscope"]
    assert doc["profiles"][0]["name"].endswith("peak increase of innermost layer calls")
    assert set(r["capture_weights"]) == INNERMOST["sequential"]
    for path, units in r["dense_units"].items():
        out_bytes = r["batch"] * units * F32
        least, most = held(out_bytes)[0], held(out_bytes, out_bytes)[1]
        assert least <= r["capture_weights"][path] <= most, (path, r["capture_weights"])
    assert r["capture_weights"]["inner.act"] >= r["batch"] * 1024 * F32  # the ReLU's own output
    stacks = {("sequential", "d1"), ("sequential", "inner", "inner.d_in"), ("sequential", "inner", "inner.act")}
    assert set(_weighed(doc)) == stacks
    # the module calls in time order: the outer model, then its layers, nested as defined
    opened = [doc["shared"]["frames"][e["frame"]]["name"] for e in doc["profiles"][1]["events"] if e["type"] == "O"]
    assert opened == ["sequential", "d1", "inner", "inner.d_in", "inner.act"]
    # over HTTP: accepted (202), complete after a forward, the stored dump weighs the same stacks
    assert r["dump_post_status"] == 202 and r["dump_job"]["status"] == "complete", r["dump_job"]
    assert r["dump_job"]["dump"]["kind"] == "speedscope"
    http = _weighed(r["dump_speedscope"])
    assert set(http) == stacks
    for stack, w in http.items():
        assert w >= r["batch"] * 1024 * F32, (stack, w)


def check_direct_call(r: dict[str, Any]) -> None:
    """The nested ``inner`` called on its own is a forward of its own, rooted at its path: it and
    its layers once each, nothing else."""
    assert r["direct_forwards"] == 1
    assert r["direct_calls"] == {"": 0, "d1": 0, "inner": 1, "inner.d_in": 1, "inner.act": 1}
