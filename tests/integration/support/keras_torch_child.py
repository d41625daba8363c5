"""Run by ``test_keras_torch_backend.py`` in a child process (``python -m``): Keras reads
``KERAS_BACKEND`` once, when it is first imported, so the backend is set here before that import,
in a process of its own, and the test process never imports keras.

For each model of ``CASES`` it prints one ``RESULT <json>`` line with what the test asserts on:
the library's per-layer figures and ``layer_exit`` events, the reference ledger's calls over the
same run, whether outputs are bit-identical, and (for the Sequential case) what the endpoint shows.

Every case states its layer paths by hand, from the model's definition: the reference ledger
records calls under those paths, independently of ``memprof_otel``'s own walk of the Keras tree.
"""
from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "torch"  # before keras is imported: it reads the backend once

import json  # noqa: E402
import sys  # noqa: E402
import urllib.request  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import memprof_otel as mp  # noqa: E402
from tests.integration.support.keras_subclassed import subclassed_net  # noqa: E402
from tests.integration.support.reference_ledger import ReferenceLedger  # noqa: E402

BATCH = 64
FEATURES = 32
FORWARDS = 2
ATTRIBUTE_EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0, "max_events": 100_000}

# a case: (model, {path: layer} written from the definition, {path of a Dense: its units})
Case = tuple[Any, dict[str, Any], dict[str, int]]


def sequential_case() -> Case:
    """A Sequential holding a nested Sequential."""
    inner = keras.Sequential([keras.layers.Dense(128, name="d_in"), keras.layers.ReLU(name="act")], name="inner")
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(256, name="d1"), inner], name="outer")
    paths = {"": model, "d1": model.get_layer("d1"), "inner": inner,
             "inner.d_in": inner.get_layer("d_in"), "inner.act": inner.get_layer("act")}
    return model, paths, {"d1": 256, "inner.d_in": 128}


def functional_case() -> Case:
    """A functional model calling a nested functional model; both have a layer named ``d``."""
    sub_in = keras.Input((64,))
    hid = keras.layers.Dense(96, name="hid")
    sub_d = keras.layers.Dense(48, name="d")
    submodel = keras.Model(sub_in, sub_d(hid(sub_in)), name="submodel")
    inp = keras.Input((FEATURES,))
    d = keras.layers.Dense(64, name="d")
    model = keras.Model(inp, submodel(d(inp)), name="func")
    paths = {"": model, "d": d, "submodel": submodel, "submodel.hid": hid, "submodel.d": sub_d}
    return model, paths, {"d": 64, "submodel.hid": 96, "submodel.d": 48}


def subclassed_case() -> Case:
    model = subclassed_net(keras, 80, 72, 40)
    paths = {"": model, "stem": model.stem, "block_a": model.blocks[0], "block_a.fc": model.blocks[0].fc,
             "block_b": model.blocks[1], "block_b.fc": model.blocks[1].fc, "head_out": model.head}
    return model, paths, {"stem": 80, "block_a.fc": 72, "block_b.fc": 40}


CASES: dict[str, Callable[[], Case]] = {
    "sequential": sequential_case, "functional": functional_case, "subclassed": subclassed_case,
}


def _events(h: Any) -> list[list[Any]]:
    return [[e["layer"], int(e["peak_increase_bytes"]), int(e["retained_bytes"])]
            for e in h.events() if e["type"] == "layer_exit"]


def _stats(h: Any) -> dict[str, dict[str, int]]:
    return {p: {"peak_increase": s.peak_increase, "retained": s.retained, "calls": s.calls}
            for p, s in h.layer_stats().items()}


def run_case(name: str, build: Callable[[], Case]) -> dict[str, Any]:
    model, paths, dense = build()
    x = torch.randn(BATCH, FEATURES)
    plain = model(x)  # uninstrumented; also builds a subclassed model's weights before we measure
    out: dict[str, Any] = {"dense_units": dense, "batch": BATCH,
                           "named_modules": [p for p, _ in model.named_modules()]}

    # the library with the reference ledger around it, in one run (see reference_ledger.py)
    h = mp.instrument(model, name=name, **ATTRIBUTE_EVERY)
    with ReferenceLedger(model, paths={id(layer): p for p, layer in paths.items()}) as ref:
        outs = [model(x) for _ in range(FORWARDS)]
    out["library"] = _events(h)
    out["stats"] = _stats(h)
    # what names the failing layer of an out-of-memory forward (traceback frame -> path)
    out["object_paths"] = {p: h.object_paths().get(id(layer)) for p, layer in paths.items()}
    out["bit_identical"] = all(torch.equal(o, plain) for o in outs)
    out["reference"] = [list(c) for c in ref.calls]
    out["reference_unclosed"] = ref.unclosed
    out["reference_born_outside_dispatch"] = ref.born_outside_dispatch
    del outs
    h.uninstrument()

    # the library alone: the reference beside it must not have changed what it measured
    h = mp.instrument(model, name=name, **ATTRIBUTE_EVERY)
    outs = [model(x) for _ in range(FORWARDS)]
    out["library_alone"] = _events(h)
    out["bit_identical_alone"] = all(torch.equal(o, plain) for o in outs)
    del outs
    if name == "sequential":
        out.update(_sequential_extras(model, h, x))
    h.uninstrument()
    out["bit_identical_after"] = torch.equal(model(x), plain)
    return out


def _sequential_extras(model: Any, h: Any, x: torch.Tensor) -> dict[str, Any]:
    """What the endpoint shows, a deep capture, predict(), a layer called on its own, and a
    max_depth that cuts the Keras tree."""
    extras: dict[str, Any] = {}
    srv = mp.serve(port=0)
    try:
        get = lambda path: urllib.request.urlopen(srv.url + path, timeout=10).read().decode()  # noqa: E731
        extras["http_layers"] = sorted(json.loads(get("/v1/layers"))["models"][h.name]["layers"])
        extras["metrics"] = get("/metrics")
    finally:
        srv.close()

    # a deep capture of one forward: every allocation under the Keras layer path that made it
    cap = h.capture(forwards=1)
    model(x)
    extras["capture_done"] = cap.wait(30)
    extras["capture_speedscope"] = cap.speedscope()
    by_layer: dict[str, int] = {}
    for stack, nbytes in cap.allocations:  # (model name, layer paths..., op), bytes
        layer = stack[-2] if len(stack) > 2 else ""
        by_layer[layer] = by_layer.get(layer, 0) + nbytes
    extras["capture_bytes_by_layer"] = by_layer

    # predict() runs the model eagerly per batch on this backend: every batch is a forward
    before = _stats(h)
    xs = np.random.default_rng(0).standard_normal((2 * BATCH, FEATURES)).astype("float32")
    predicted = model.predict(xs, batch_size=BATCH, verbose=0)
    extras["predict_calls"] = {p: s["calls"] - before[p]["calls"] for p, s in _stats(h).items()}
    h.pause()
    extras["predict_bit_identical"] = bool(np.array_equal(predicted, model.predict(xs, batch_size=BATCH, verbose=0)))
    h.resume()

    # a layer called directly, outside the model (as serving code calls an encoder): its own forward
    before = _stats(h)
    model.get_layer("inner")(torch.randn(BATCH, 256))
    extras["direct_calls"] = {p: s["calls"] - before[p]["calls"] for p, s in _stats(h).items()}

    h.uninstrument()
    shallow = mp.instrument(model, name="shallow", attribution={**ATTRIBUTE_EVERY, "max_depth": 1})
    model(x)
    extras["max_depth_1"] = _stats(shallow)
    shallow.uninstrument()
    return extras


def main(names: list[str]) -> None:
    assert keras.backend.backend() == "torch", keras.backend.backend()
    for name in names or list(CASES):
        print("RESULT " + json.dumps({"case": name, **run_case(name, CASES[name])}), flush=True)
    print("KERAS_VERSION " + keras.__version__, flush=True)
    mp.shutdown(5)


if __name__ == "__main__":
    main(sys.argv[1:])
