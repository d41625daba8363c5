"""A Keras backend, not an adapter of its own: Keras 3 models on the TensorFlow backend, instrumented
by the shared Keras adapter (``attribution/keras/``) with TensorFlow's parts. The one package of
attribution that imports tensorflow.

``instrumentation.py`` ``TfBackend``: eager, device, counter (``sources/tensorflow.py``); ``attach``

Public: nothing by import: ``memprof_otel.instrument()`` picks this backend for a
Keras-on-TensorFlow model. The module paths are internal.
"""
