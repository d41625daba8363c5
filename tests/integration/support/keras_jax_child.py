"""Run by ``test_keras_jax_backend.py`` with the JAX interpreter (``MEMPROF_TEST_JAX_PYTHON``,
``KERAS_BACKEND=jax``, ``PYTHONPATH`` = the repository): the test process never imports keras, whose
backend is fixed at its first import.

For each model of ``CASES`` it prints one ``RESULT <json>`` line with what the test asserts on: the
per-layer figures of eager forwards, whether outputs are bit-identical, what ``jax.jit`` and a
jitted ``predict`` do while instrumented, what is left on the layers after ``uninstrument()``, and
(for the Sequential case) what the endpoint shows; then ``COUNTER`` (the counter alone around
arrays of known size) and ``VERSIONS``. Nothing here decides pass or fail.
"""
from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "jax"  # before keras is imported: it reads the backend once

import json  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from memprof_otel import instrument, shutdown  # noqa: E402
from memprof_otel.attribution.jax.instrumentation import _made_here_is_concrete, _trace_check  # noqa: E402
from memprof_otel.sources.jax_memory import JaxMemoryCounter  # noqa: E402
from tests.integration.support import keras_child_common as common  # noqa: E402
from tests.integration.support.keras_behaviour import behaviour  # noqa: E402
from tests.integration.support.keras_cases import CASES  # noqa: E402

BATCH = common.BATCH


def _same(a: Any, b: Any) -> bool:
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def run_case(name: str) -> dict[str, Any]:
    model, dense = CASES[name](keras, common.FEATURES)
    x = jax.numpy.asarray(np.random.default_rng(0).standard_normal((BATCH, common.FEATURES)).astype("float32"))
    plain = np.asarray(model(x))  # uninstrumented; builds the weights before we measure
    plain_jit = jax.jit(lambda t: model(t))
    plain_jitted = np.asarray(plain_jit(x))  # traced on the plain model, before instrument()
    plain_predicted = model.predict(x, batch_size=BATCH // 4, verbose=0)
    out: dict[str, Any] = {"dense_units": dense, "batch": BATCH}

    h = instrument(model, name=name, **common.ATTRIBUTE_EVERY)
    out["device"] = h.last_device
    out["method"] = h.summary_dict()["method"]
    outs = [np.asarray(model(x)) for _ in range(common.FORWARDS)]
    out["stats"] = common.stats(h)
    out["forwards"] = h.status()["forwards"]
    out["unattributed"] = dict(h.unattributed)
    out["bit_identical"] = all(_same(o, plain) for o in outs)

    # jax.jit while instrumented: the wrappers run only while it is traced, on tracers
    before = common.stats(h)
    fn = jax.jit(lambda t: model(t))
    jitted = [np.asarray(fn(x)) for _ in range(3)]
    out["jit"] = {
        "calls_added": common.calls_added(h, before),
        "forwards_added": h.status()["forwards"] - out["forwards"],
        "bit_identical_to_plain_jit": all(_same(o, plain_jitted) for o in jitted),
        # the function traced on the plain model before instrument(): same result
        "plain_jit_bit_identical": _same(plain_jit(x), plain_jitted),
    }
    # predict (Keras jits its predict step on JAX): no per-layer figures either, same result
    before = common.stats(h)
    predicted = model.predict(x, batch_size=BATCH // 4, verbose=0)
    out["predict_calls_added"] = common.calls_added(h, before)
    out["predict_bit_identical"] = _same(predicted, plain_predicted)
    out["forwards_after_jit_and_predict"] = h.status()["forwards"]
    # predict() compiled with run_eagerly=True calls the model eagerly per batch: each is a forward
    model.compile(run_eagerly=True)
    before = common.stats(h)
    eager_predicted = model.predict(x, batch_size=BATCH // 4, verbose=0)
    out["eager_predict_calls_added"] = common.calls_added(h, before)
    out["eager_predict_allclose"] = bool(np.allclose(eager_predicted, plain, rtol=1e-5, atol=1e-5))

    if name == "sequential":
        srv = common.serve()
        try:
            out.update(common.endpoint_layers_and_metrics(h, srv))
            out.update(common.captures(h, lambda: model(x), srv))
            out.update(common.direct_call(h, model, jax.numpy.ones((BATCH, 4096), "float32")))
        finally:
            srv.close()
    out.update(common.pause_resume_uninstrument(h, model))
    out["bit_identical_after"] = _same(model(x), plain)
    return out


def counter() -> dict[str, Any]:
    """The counter alone, around arrays of known size, and the two ways of telling a trace."""
    c = JaxMemoryCounter()
    r0 = c.read_and_reset()
    a = jax.numpy.ones((1024, 1024))  # 4 MiB, kept
    b = a + 1.0                       # 4 MiB more, then freed: a transient between two reads
    b.block_until_ready()
    del b
    r1 = c.read_and_reset()
    r2 = c.read_and_reset()           # nothing happened since r1
    del a
    r3 = c.read_and_reset()
    seen: list[list[bool]] = []
    check = _trace_check()

    @jax.jit
    def traced(t: Any) -> Any:
        seen.append([check(), _made_here_is_concrete()])
        return t + 1

    traced(jax.numpy.ones(3))
    return {"r0": list(r0), "r1": list(r1), "r2": list(r2), "r3": list(r3),
            "lower_bound": c.peak_is_lower_bound, "eager_outside": [check(), _made_here_is_concrete()],
            "eager_inside_jit": seen[0], "check": getattr(check, "__qualname__", "")}


def main(names: list[str]) -> None:
    """``names``: the cases to run, and ``behaviour``/``counter``; all when none is given."""
    assert keras.backend.backend() == "jax", keras.backend.backend()
    for name in names or [*CASES, "behaviour", "counter"]:
        if name == "behaviour":
            x = jax.numpy.ones((BATCH, common.FEATURES), "float32")
            print("BEHAVIOUR " + json.dumps(behaviour(keras, x, _trace_check())), flush=True)
        elif name == "counter":
            print("COUNTER " + json.dumps(counter()), flush=True)
        else:
            print("RESULT " + json.dumps({"case": name, **run_case(name)}), flush=True)
    print("VERSIONS " + json.dumps({"jax": jax.__version__, "keras": keras.__version__,
                                    "torch_imported": "torch" in sys.modules,
                                    "tensorflow_imported": "tensorflow" in sys.modules}), flush=True)
    shutdown(5)


if __name__ == "__main__":
    main(sys.argv[1:])
