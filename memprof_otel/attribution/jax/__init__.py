"""A Keras backend, not an adapter of its own: Keras 3 models on the JAX backend, instrumented by the
shared Keras adapter (``attribution/keras/``) with JAX's parts. The one package of attribution that
imports jax.

``instrumentation.py`` ``JaxBackend``: eager, device, counter (``sources/jax_memory.py``); ``attach``

Public: nothing by import: ``memprof_otel.instrument()`` picks this backend for a Keras-on-JAX
model. The module paths are internal.
"""
