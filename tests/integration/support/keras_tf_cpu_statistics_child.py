"""Run by ``test_keras_tf_cpu_statistics.py`` with the TensorFlow interpreter, ``TF_CPU_ALLOCATOR_USE_BFC``
as the test sets it. ``argv[1]`` says in which order things happen:

- ``probe``: TensorFlow alone, its first op, then whether its CPU allocator keeps statistics: what this
  CPU's default is (no memprof_otel imported).
- ``import_first``: ``import memprof_otel``, then a Keras model is built and instrumented.
- ``tf_first``: TensorFlow runs its first op (its CPU device is created) and is asked what ``probe``
  asks, then memprof_otel is imported.

Prints one ``RESULT <json>`` line; nothing here decides pass or fail.
"""
from __future__ import annotations

import json
import logging
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"


def _probe() -> dict[str, object]:
    import tensorflow as tf
    tf.zeros((4, 4)).numpy()  # TensorFlow creates its CPU device now
    try:
        tf.config.experimental.get_memory_info("CPU:0")
        return {"default_keeps_statistics": True}
    except ValueError as e:
        return {"default_keeps_statistics": False, "error": str(e)}


def _instrumented(order: str) -> dict[str, object]:
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger().addHandler(Keep())
    # TensorFlow first: its default as the probe finds it (a query: it changes nothing), in the same
    # process, which saves the probe a TensorFlow start of its own
    probed = _probe() if order == "tf_first" else {}
    import memprof_otel as mp
    import keras
    import numpy as np
    # widths grow layer by layer: a later layer's tensors never fit in a block an earlier one freed,
    # which TF would count whole (its figures are blocks, not tensor sizes)
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(512, name="d1"),
                              keras.layers.Dense(1024, name="d2")])
    x = np.ones((512, 256), dtype="float32")
    model(x)  # builds the weights before we measure
    h = mp.instrument(model, name="cpu-stats", every_n_forwards=1, overhead_budget=1.0)
    for _ in range(3):
        model(x)
    out = {"env": os.environ.get("TF_CPU_ALLOCATOR_USE_BFC"), "figures": h.status()["figures"],
           "forwards": h.status()["forwards"],
           "stats": {k: {"peak_increase": v.peak_increase, "retained": v.retained, "calls": v.calls}
                     for k, v in h.layer_stats().items()},
           "warnings": [r for r in records if "memprof_otel" in r], **probed}
    h.uninstrument()
    return out


if __name__ == "__main__":
    mode = sys.argv[1]
    result = _probe() if mode == "probe" else _instrumented(mode)
    print("RESULT " + json.dumps(result), flush=True)
