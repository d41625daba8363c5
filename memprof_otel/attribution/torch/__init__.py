"""The torch adapter: the ``Instrumentation`` of a ``torch.nn.Module``, over the framework-neutral
accounting of ``attribution/``. The one package of attribution that imports torch.

``held.py`` what a model holds by storage: its weights and the KV cache it was last called with
``hooks.py`` process-wide module hooks, installed only while some thread attributes a forward
``instrumentation.py`` ``TorchInstrumentation``: root hooks, compile switch, per-thread forwards
``root_hooks.py`` what the handle puts on the model: root hooks, compiled-call stand-in, args watch

Public: nothing by import: ``memprof_otel.instrument()`` picks this adapter for a torch model, and
its handle is a ``memprof_otel.Instrumentation``. The module paths are internal.
"""
