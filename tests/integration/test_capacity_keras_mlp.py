"""A Keras MLP on the TensorFlow backend, input ``(n, 32)``: its memory model's one feature is the
batch (the 32 is the model's width, not a sequence length a question must give), so a question
about a batch answers, and one with ``seq_len`` is a ``ShapeError`` saying what the features are.

TensorFlow runs in a child process under ``MEMPROF_TEST_TF_PYTHON`` (see
``test_keras_tensorflow_backend.py``); without the variable the module is skipped, saying so.
"""
from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.integration.support.demo_process import REPO

# the test command may still be building the TensorFlow venv: the tests wait (tests/framework_venvs.py)
pytestmark = pytest.mark.framework_venv("tf")

TF_PYTHON = os.environ.get("MEMPROF_TEST_TF_PYTHON")
if not TF_PYTHON:
    pytest.skip("MEMPROF_TEST_TF_PYTHON is not set (the interpreter with tensorflow-cpu that "
                "scripts/install-and-test.sh builds as .venv-tf)", allow_module_level=True)

CHILD = """
import json
import numpy as np
import keras
import memprof_otel as mp

model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(8)])
h = mp.instrument(model, name="mlp", every_n_forwards=1, overhead_budget=1.0)
for n in (64, 128, 256, 512, 1024, 2048):
    model(np.random.rand(n, 32).astype("float32"))
h.capacity.model.states(force=True)
p = h.predict_peak(batch=4096)
try:
    h.predict_peak(batch=4, seq_len=32)
    refused = None
except mp.ShapeError as e:
    refused = str(e)
doc = h.headroom()
print("RESULT " + json.dumps({"features": doc["model_fit"]["features"], "reason": p.reason,
                              "factor": p.extrapolation_factor, "peak": p.peak_increase_bytes,
                              "table": list(doc.get("max_safe_batch", {})), "refused": refused}))
"""


def test_a_keras_mlp_is_modelled_on_its_batch_alone() -> None:
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([str(TF_PYTHON), "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and len(lines) == 1, proc.stderr[-4000:]
    out: dict[str, Any] = json.loads(lines[0].split(" ", 1)[1])
    assert out["features"] == ["batch"]
    assert out["reason"] is None and out["factor"] == 2.0 and out["peak"] > 0
    assert out["table"] == ["any"]
    assert out["refused"].startswith("unknown feature [seq_len]: the model's features are [batch]")
