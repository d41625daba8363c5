"""``instrument(model)`` for a Keras 3 model on the JAX backend: the shared Keras adapter
(``attribution/keras/``) with JAX's parts.

Eager means no JAX trace is open: under ``jax.jit`` (a compiled ``predict``/``fit``, ``jax.jit(model)``,
``jit(model.stateless_call)``), ``grad``, ``vmap`` or ``eval_shape`` (Keras builds functional models
with it) the layer code runs once per trace on tracers, and later jitted calls run without Python.
The check is ``jax._src.core.trace_state_clean()`` (what ``jax.core.trace_state_clean`` was before
JAX took it out of its public module; ~0.3 us): the public alternative, looking for a ``Tracer``
among a layer's inputs, calls a jit over closed-over arrays eager. Should a JAX lack it, an array
made now is a ``jax.core.Tracer`` exactly when a trace is open (slower: one tiny op per call).
The counter (``sources/jax_memory.py``) reads the device's allocator statistics where it keeps
them, else its live arrays (CPU): peaks there are lower bounds.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

import jax

from ...sources.base import HotCounter
from ...sources.jax_memory import JaxMemoryCounter, jax_device_label
from ..keras.instrumentation import attach_for


def _made_here_is_concrete() -> bool:
    """Eager when an array made now is no tracer (inside a trace it is staged and is one)."""
    return not isinstance(jax.numpy.zeros(()), jax.core.Tracer)


def _trace_check() -> Callable[[], bool]:
    try:
        clean = getattr(importlib.import_module("jax._src.core"), "trace_state_clean", None)
    except ImportError:
        clean = None
    return clean if callable(clean) else _made_here_is_concrete


class JaxBackend:
    """JAX's part of the Keras adapter (``KerasBackend``). Devices are JAX's own objects; Keras puts
    a model's arrays on the default one, ``jax.devices()[0]``."""

    name = "jax"
    title = "JAX"

    def __init__(self) -> None:
        self.eager = _trace_check()

    def device(self) -> Any:
        return jax.devices()[0]

    def device_label(self, device: Any) -> str:
        return jax_device_label(device)

    def counter(self, device: Any) -> HotCounter:
        return JaxMemoryCounter(device)

    def method(self, device: Any) -> str:
        if device.memory_stats() is not None:
            return "jax allocator statistics; peak derived from the all-time high"
        return "jax live arrays; retained exact, peak a lower bound"

    def how(self, device: Any) -> str:
        return ""  # the same figures whatever the environment


# ``attach(model, name=None, config=None, shape_of=None, **overrides)``, as frameworks.py calls it
attach = attach_for(JaxBackend())


__all__ = ["JaxBackend", "attach"]
