"""Dumps: deep capture of forwards, the files built from it, where they are stored, and the OOM flight
recorder. No torch import: the adapters record into a ``Capture``, and the service is handed the
live handles.

``capture.py`` ``Capture``: a model's next N forwards, each allocation attributed to module path and op
``flame.py`` the plain data of one flame graph, shared by the speedscope and the pprof files (pure)
``heap_diff.py`` Python-heap growth between two tracemalloc snapshots: top sites, speedscope (pure)
``heap_session.py`` the bounded tracemalloc session behind ``POST /v1/heap``, one at a time
``jobs.py`` dump requests in flight: the bounded table behind ``POST /v1/dumps`` (202) and its polling
``oom_recorder.py`` the OOM flight recorder: what led to a forward's out-of-memory error
``pprof.py`` a flame graph as a gzipped pprof profile (``format=pprof``)
``service.py`` dumps on demand: capture, wait, store, count
``speedscope.py`` the speedscope file format (pure)
``store.py`` stored dumps: one file each in a private folder, oldest removed past a count or size cap
``vendor/pprof/`` pprof's ``profile.proto`` with its licence: the format ``pprof.py`` writes

Public: ``memprof_otel.Capture`` (what ``h.capture()`` returns), ``POST /v1/dumps``,
``GET /v1/dumps[/{id}]`` and ``POST /v1/heap``, ``memprof-otel dump`` and ``memprof-otel heap``, the
dump files (docs/reference.md, Dump files), ``memprof_dumps_total`` and the ``dumps.*`` config.
The module paths are internal.
"""
