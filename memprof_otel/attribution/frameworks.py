"""Which adapter instruments a model, chosen by the model's type.

An adapter's framework is imported only when a model of it is handed over: a model of torch's can
only exist once torch is imported, so ``sys.modules`` says whether to look, and ``import
memprof_otel``, the endpoint, the exporters and the CLI run in an image without torch.

A Keras 3 model on the torch backend is a ``torch.nn.Module``: the torch adapter takes it and reads
its layer tree from Keras (``keras_tree.py``). On the TensorFlow backend it is no ``tf.Module``: it
is recognised by its classes' names, with no import (a model of it exists only once TensorFlow is
imported), and the Keras adapter takes it with TensorFlow's parts; on JAX likewise, with JAX's
(``attribution/keras/``, ``attribution/tensorflow/``, ``attribution/jax/``).
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

from ..capacity.shapes import ShapeOf
from ..config import Config
from ..errors import InstrumentationError
from .instrumentation import Instrumentation
from .keras_tree import is_keras_layer, keras_backend_of

# attach(model, name, config, shape_of): hooks the model, registers and returns its handle
Attach = Callable[[Any, "str | None", Config, "ShapeOf | None"], Instrumentation]


def _is_torch_module(model: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


# a Keras model's backend (``keras_backend_of``) -> the adapter module with its ``attach``. A Keras
# model on the torch backend is a torch.nn.Module: the torch adapter takes it, before this table.
_TORCH_ADAPTER = "memprof_otel.attribution.torch.instrumentation"
_KERAS_ADAPTERS = {
    "tensorflow": "memprof_otel.attribution.tensorflow.instrumentation",
    "jax": "memprof_otel.attribution.jax.instrumentation",
}


def adapter_for(model: Any) -> Attach:
    """The ``attach`` of the adapter that handles ``model``; InstrumentationError for a model of no
    framework we instrument."""
    if _is_torch_module(model):
        module: str | None = _TORCH_ADAPTER
    else:
        module = _KERAS_ADAPTERS.get(keras_backend_of(model) or "")
    if module is not None:
        return importlib.import_module(module).attach  # type: ignore[no-any-return]
    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    takes = ("instrument() takes a PyTorch model (a torch.nn.Module, a Keras 3 model on the torch "
             "backend included) or a Keras 3 model on the TensorFlow or JAX backend")
    if is_keras_layer(model):
        # a Keras model on another backend (OpenVINO, a future one): say which, what runs, and how to
        # get per-layer figures
        backend = keras_backend_of(model) or "another"
        raise InstrumentationError(f"{takes}; got {kind}, a Keras model on the {backend} backend, which "
                                   "is not instrumented: the process series (start_monitoring()) still "
                                   "measure it; set KERAS_BACKEND=torch, tensorflow or jax before keras is "
                                   "imported for per-layer figures")
    if _is_tf_module(model):
        raise InstrumentationError(f"{takes}; got {kind}, a tf.Module that is no Keras model: its layers "
                                   "are called through their classes' __call__, which an instance cannot "
                                   "wrap, so nothing is attributed per layer; build it from Keras layers "
                                   "for per-layer figures, or wrap each request in mp.operation() for its "
                                   "peak and duration (the process series measure it either way)")
    raise InstrumentationError(f"{takes}; got {kind}")


def _is_tf_module(model: Any) -> bool:
    tf = sys.modules.get("tensorflow")  # never imported here: a tf.Module exists only once it is
    module_cls = getattr(tf, "Module", None) if tf is not None else None
    return isinstance(module_cls, type) and isinstance(model, module_cls)


__all__ = ["adapter_for"]
