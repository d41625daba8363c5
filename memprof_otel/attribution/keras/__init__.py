"""The Keras adapter, shared by the backends whose models are no ``torch.nn.Module``: TensorFlow
(``attribution/tensorflow/``) and JAX (``attribution/jax/``) each supply a ``KerasBackend``. On the
torch backend a Keras model is a ``torch.nn.Module``, and the torch adapter takes it. Imports no
framework.

``backend.py`` ``KerasBackend``: what a backend supplies (eager or not, the device, its counter)
``instrumentation.py`` ``KerasInstrumentation``: each tracked layer's ``call`` wrapped; ``attach_for``

Public: nothing by import: ``memprof_otel.instrument()`` picks this adapter for a Keras model. The
module paths are internal.
"""
