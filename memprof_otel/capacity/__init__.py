"""How much more fits: a memory model of each instrumented model (peak as a function of input shape),
the memory budget that applies to its device, and the answers built from the two (headroom, largest
safe batch).

``memory_budget.py`` which limit applies and what is available: arithmetic over readings (pure)
``memory_budget_reader.py`` the I/O half of the budget: cudaMemGetInfo, cgroup, psutil, cached briefly
``fit.py`` the model family, non-negative least squares, leave-one-shape-out error (pure)
``model.py`` one model's bounded table of shapes, its regimes, predictions and max-safe search
``service.py`` one model's capacity answers, fed by its handle after each measured forward
``shapes.py`` a forward's shape features, read from its arguments by duck typing (no torch import)

Public: ``GET /v1/headroom`` and ``h.headroom()``/``h.fits()``/``h.predict_peak()`` of an
``Instrumentation``, ``memprof-otel headroom``, the ``memprof_capacity_*`` families and the
``capacity.*`` config (docs/capacity.md). The module paths are internal.
"""
