"""The ``device`` label of a TensorFlow device name, over a stand-in ``tensorflow`` module (the
label is pure string work; the real TF is in its own venv, ``test_keras_tensorflow_backend.py``)."""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import pytest


@pytest.fixture
def tfs(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setitem(sys.modules, "tensorflow", types.ModuleType("tensorflow"))
    monkeypatch.delitem(sys.modules, "memprof_otel.sources.tensorflow", raising=False)
    yield importlib.import_module("memprof_otel.sources.tensorflow")
    sys.modules.pop("memprof_otel.sources.tensorflow", None)


@pytest.mark.parametrize("name, label", [("CPU:0", "cpu"), ("CPU:1", "cpu"), ("GPU:0", "cuda:0"),
                                         ("GPU:3", "cuda:3"), ("GPU", "cuda:0"), ("TPU:1", "tpu:1")])
def test_tf_devices_carry_the_labels_torch_gives_the_same_device(tfs: Any, name: str, label: str) -> None:
    # a GPU is "cuda:N" as torch and the GPU alerts (device=~"cuda:.*") name it
    assert tfs.tf_device_label(name) == label
