"""What a Keras backend supplies to the shared Keras adapter (``instrumentation.py``).

The wrapping of each layer's ``call``, the per-thread forward and the dropping of overlapping
forwards are the same on every backend; what differs is how to tell an eager call from one being
traced into a graph, which device the model's arrays go to, and the counter read there. This module
imports no framework: a backend module (which may) implements the protocol.
"""
from __future__ import annotations

from typing import Any, Protocol

from ...sources.base import HotCounter


class KerasBackend(Protocol):
    """One Keras backend's part of the adapter."""

    name: str  # Keras's name for it (``keras_backend_of``): "tensorflow", "jax"
    title: str  # for messages: "TensorFlow", "JAX"

    def eager(self) -> bool:
        """True when a layer call runs now on real values; False while a function is being traced
        (``tf.function``, ``jax.jit``): the wrappers then pass through and measure nothing."""
        ...

    def device(self) -> Any:
        """The device Keras puts the model's arrays on by default, as the backend names it (TF: a
        string, ``"CPU:0"``; JAX: its ``Device`` object)."""
        ...

    def device_label(self, device: Any) -> str:
        """The exported ``device`` label of ``device`` (``"cpu"`` as torch CPU figures carry it)."""
        ...

    def counter(self, device: Any) -> HotCounter:
        """The counter every layer boundary reads; ValueError or RuntimeError when the backend
        keeps no figures there (the model is then counted, not attributed)."""
        ...

    def method(self, device: Any) -> str:
        """What the figures are read from, for the summary (``attribution_method``)."""
        ...

    def how(self, device: Any) -> str:
        """How the figures came to be available there, when that depends on the environment (TF's
        CPU statistics on ``TF_CPU_ALLOCATOR_USE_BFC``), else ``""``: for ``/v1/status``."""
        ...


__all__ = ["KerasBackend"]
