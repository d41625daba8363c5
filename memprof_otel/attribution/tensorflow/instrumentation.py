"""``instrument(model)`` for a Keras 3 model on the TensorFlow backend: the shared Keras adapter
(``attribution/keras/``) with TensorFlow's parts.

Eager is ``tf.executing_eagerly()``: inside ``tf.function``, a compiled ``predict``/``fit`` or a
``jit_compile`` function it is False while the function is traced, and later calls run the graph
without Python. The counter is TF's allocator statistics for the model's device
(``sources/tensorflow.py``).
"""
from __future__ import annotations

import tensorflow as tf

from ...sources.base import HotCounter
from ...sources.tensorflow import TfAllocatorCounter, tf_device_label
from ...sources.tf_cpu_statistics import how_requested, unavailable_hint
from ..keras.instrumentation import attach_for


class TfBackend:
    """TensorFlow's part of the Keras adapter (``KerasBackend``)."""

    name = "tensorflow"
    title = "TensorFlow"

    def __init__(self) -> None:
        # looked up once: the wrappers ask at every layer call
        self.eager = tf.executing_eagerly

    def device(self) -> str:
        """Where Keras places a model's ops by default: the first GPU when TF sees one, else the CPU."""
        gpus = tf.config.list_logical_devices("GPU")
        return "GPU:0" if gpus else "CPU:0"

    def device_label(self, device: str) -> str:
        return tf_device_label(device)

    def counter(self, device: str) -> HotCounter:
        try:
            return TfAllocatorCounter(device)
        except ValueError as e:
            if device.startswith("CPU"):  # the one TF device whose statistics depend on a variable
                raise ValueError(f"{e}; {unavailable_hint()}") from e
            raise

    def method(self, device: str) -> str:
        return "tensorflow allocator statistics"

    def how(self, device: str) -> str:
        """How the CPU's statistics came to be kept (``/v1/status``'s ``figures``)."""
        return how_requested() if device.startswith("CPU") else ""


# ``attach(model, name=None, config=None, shape_of=None, **overrides)``, as frameworks.py calls it
attach = attach_for(TfBackend())


__all__ = ["TfBackend", "attach"]
