"""Run by ``test_keras_tensorflow_backend.py`` with the TensorFlow interpreter
(``MEMPROF_TEST_TF_PYTHON``, ``KERAS_BACKEND=tensorflow``, ``PYTHONPATH`` = the repository): the test
process has no TensorFlow and never imports keras, whose backend is fixed at its first import.

For each model of ``CASES`` it prints one ``RESULT <json>`` line with what the test asserts on: the
per-layer figures of eager forwards, whether outputs are bit-identical, what a ``tf.function`` and a
compiled ``predict`` do while instrumented, what is left on the layers after ``uninstrument()``,
and (for the Sequential case) what the endpoint shows. Nothing here decides pass or fail.
"""
from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "tensorflow"  # before keras is imported: it reads the backend once

import json  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import memprof_otel as mp  # noqa: E402
from tests.integration.support.keras_behaviour import behaviour  # noqa: E402
from tests.integration.support.keras_cases import CASES, Case  # noqa: E402
from tests.integration.support.keras_child_common import (ATTRIBUTE_EVERY, BATCH, FEATURES, FORWARDS,  # noqa: E402
                                                  calls_added, captures, direct_call, endpoint_layers_and_metrics,
                                                  pause_resume_uninstrument, stats)
from memprof_otel.sources.tensorflow import TfAllocatorCounter  # noqa: E402


def run_case(name: str, build: Callable[[Any, int], Case]) -> dict[str, Any]:
    model, dense = build(keras, FEATURES)
    x = tf.constant(np.random.default_rng(0).standard_normal((BATCH, FEATURES)).astype("float32"))
    plain = model(x).numpy()  # uninstrumented; builds the weights before we measure
    plain_graph_fn = tf.function(lambda t: model(t))
    plain_graph = plain_graph_fn(x).numpy()  # traced on the plain model, before instrument()
    out: dict[str, Any] = {"dense_units": dense, "batch": BATCH}

    h = mp.instrument(model, name=name, **ATTRIBUTE_EVERY)
    out["device"] = h.last_device
    out["method"] = h.summary_dict()["method"]
    outs = [model(x).numpy() for _ in range(FORWARDS)]
    out["stats"] = stats(h)
    out["forwards"] = h.status()["forwards"]
    out["unattributed"] = dict(h.unattributed)
    out["bit_identical"] = all(np.array_equal(o, plain) for o in outs)

    # tf.function while instrumented: the wrappers run only while it is traced, outside eager
    before = stats(h)
    fn = tf.function(lambda t: model(t))
    graph_outs = [fn(x).numpy() for _ in range(3)]
    out["tf_function"] = {
        "tracing_count": fn.experimental_get_tracing_count(),
        "calls_added": calls_added(h, before),
        "forwards_added": h.status()["forwards"] - out["forwards"],
        "bit_identical_to_plain_graph": all(np.array_equal(o, plain_graph) for o in graph_outs),
        # the function traced on the plain model before instrument(): not traced again, same result
        "plain_fn_tracing_count": plain_graph_fn.experimental_get_tracing_count(),
        "plain_fn_bit_identical": bool(np.array_equal(plain_graph_fn(x).numpy(), plain_graph)),
    }
    out["tf_function"]["plain_fn_tracing_count_after"] = plain_graph_fn.experimental_get_tracing_count()

    # compiled predict (a tf.function inside Keras): no per-layer figures either
    model.compile()
    before = stats(h)
    predicted = model.predict(x, batch_size=BATCH // 4, verbose=0)
    out["predict_calls_added"] = calls_added(h, before)
    out["predict_allclose"] = bool(np.allclose(predicted, plain, rtol=1e-5, atol=1e-5))

    # predict() compiled with run_eagerly=True calls the model eagerly per batch: each is a forward
    model.compile(run_eagerly=True)
    before = stats(h)
    eager_predicted = model.predict(x, batch_size=BATCH // 4, verbose=0)
    out["eager_predict_calls_added"] = calls_added(h, before)
    out["eager_predict_allclose"] = bool(np.allclose(eager_predicted, plain, rtol=1e-5, atol=1e-5))

    if name == "sequential":
        out.update(_endpoint(h, model, x))
        out.update(direct_call(h, model, tf.ones((BATCH, 4096))))
    out.update(pause_resume_uninstrument(h, model))
    out["bit_identical_after"] = bool(np.array_equal(model(x).numpy(), plain))
    return out


def _endpoint(h: Any, model: Any, x: Any) -> dict[str, Any]:
    srv = mp.serve(port=0)
    try:
        return {**endpoint_layers_and_metrics(h, srv), **captures(h, lambda: model(x), srv)}
    finally:
        srv.close()


class Scale(tf.Module):
    """A plain tf.Module (no Keras): what instrument() says of it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(2.0)

    def __call__(self, t: Any) -> Any:
        return t * self.w


def tf_module() -> dict[str, Any]:
    m = Scale()
    try:
        mp.instrument(m)
    except mp.InstrumentationError as e:
        return {"error": str(e), "output": float(m(tf.constant(3.0)).numpy())}
    return {"error": None}


def counter() -> dict[str, Any]:
    """The counter alone, around tensors of known size: levels and peaks since each read."""
    c = TfAllocatorCounter("CPU:0")
    r0 = c.read_and_reset()
    a = tf.ones((1024, 1024))   # 4 MiB, kept
    b = a + 1.0                 # 4 MiB more, then freed: a transient
    del b
    r1 = c.read_and_reset()
    r2 = c.read_and_reset()     # nothing happened since r1: the peak window starts at the level
    del a
    r3 = c.read_and_reset()
    return {"r0": list(r0), "r1": list(r1), "r2": list(r2), "r3": list(r3)}


def main(names: list[str]) -> None:
    """``names``: the cases to run, and ``behaviour``/``counter`` for those sections; all when none
    is given. The test runs each in a process of its own: TF's CPU allocator hands a request the free
    block it finds, and a block left by an earlier case can be larger than the tensor (it counts
    the block)."""
    assert keras.backend.backend() == "tensorflow", keras.backend.backend()
    for name in names or [*CASES, "behaviour", "counter"]:
        if name == "behaviour":
            x = tf.constant(np.ones((BATCH, FEATURES), "float32"))
            print("BEHAVIOUR " + json.dumps({**behaviour(keras, x, tf.executing_eagerly),
                                             "tf_module": tf_module()}), flush=True)
        elif name == "counter":
            print("COUNTER " + json.dumps(counter()), flush=True)
        else:
            print("RESULT " + json.dumps({"case": name, **run_case(name, CASES[name])}), flush=True)
    print("VERSIONS " + json.dumps({"tensorflow": tf.__version__, "keras": keras.__version__,
                                    "torch_imported": "torch" in sys.modules}), flush=True)
    mp.shutdown(5)


if __name__ == "__main__":
    main(sys.argv[1:])
