"""Presentation over recorded data: the operations report, plots, summaries, timeline files. Reads
only what it is handed (small protocols a handle satisfies), never a model.

``plot.py`` the 4-panel PNG behind ``mp.plot(path)``: memory with phases, CPU, disk I/O, durations
``summary.py`` one instrumentation's summary: a dict for JSON, a text table for people
``text.py`` the text report behind ``mp.report()``: peak RSS, when, during which operation, the timeline
``timeline_export.py`` ``export_timeline(path)``: events, layer stats and the summary as one JSON file

Public: ``memprof_otel.report()``, ``memprof_otel.plot()``, ``h.summary()`` and
``h.export_timeline()`` of an ``Instrumentation``, and ``memprof-otel analyze``. The module paths
are internal.
"""
