"""Per-layer attribution, framework-neutral: the accounting, one attributed forward, the handle and
the live handles (the models instrumented now). No module here imports torch, tensorflow or jax; the adapters
that do are the subpackages. Forwards run on many threads at once: each attributes its own forward
(``forward_state.py``), and what they share (the statistics, the scheduler, the live handles) is locked.

``adapter.py`` ``FrameworkAdapter``: the duties a framework adapter fills in, abstract
``attaching.py`` what every adapter's ``attach`` shares: config, checks, tracked layers, registration
``forward_policy.py`` which forward is measured and how, what its end is charged to, who hears of it in flight
``forward_state.py`` one attributed forward in one thread: the per-layer hook sink and its counter
``frameworks.py`` which adapter instruments a model, its framework imported only then
``handle.py`` ``ModelHandle``: what the layers above know of an instrumented model, both ways
``instrumentation.py`` ``Instrumentation``, the handle ``instrument()`` returns, whatever the framework
``keras_tree.py`` a Keras 3 model's layer paths, read from its objects (nothing imports keras)
``kernel_reading.py`` a forward's figure in the units its memory limit counts, read at the root's ends
``layer_structure.py`` what a baseline records besides figures: each layer's signature, the environment
``measure_window.py`` a measuring window: a model's next forwards attributed, kept per input shape
``open_forwards.py`` the forwards open now on shared counters: did a forward run alone?
``peaks.py`` per-layer peak accounting over a counter's "level now" and "peak since mark" (pure)
``live_handles.py`` the models instrumented now, by name and by model object
``scheduler.py`` which forwards get exact per-layer attribution: an adaptive overhead budget
``selection.py`` which module paths get their own frame, and which fold into ``__other__`` (pure)
``stats.py`` ``LayerMemoryStats`` and the accumulator that folds layer calls into it
``trace_fold.py`` boundary readings rebuilt from allocator trace events (pure)
``traced_forward.py`` an attributed CUDA forward that reads nothing at its module boundaries
``windows.py`` per-layer peaks over fixed windows: what the exporters publish
``torch/`` the torch adapter: root hooks, process-wide module hooks, what a model holds
``keras/`` the Keras adapter, shared by the Keras backends whose models are no ``torch.nn.Module``
``tensorflow/`` a Keras backend: Keras 3 on TensorFlow (not a TensorFlow adapter of its own)
``jax/`` a Keras backend: Keras 3 on JAX (not a JAX adapter of its own)

Public: ``memprof_otel.Instrumentation`` (the handle ``memprof_otel.instrument()`` returns) and
``memprof_otel.LayerMemoryStats``, the ``attribution.*`` config, the per-layer figures of
``GET /v1/layers`` and the ``memprof_layer_*`` families, and ``POST /v1/baseline``'s window. The
module paths are internal.
"""
