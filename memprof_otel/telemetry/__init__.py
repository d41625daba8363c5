"""Process telemetry: the sampler, operations and their stats, the leak watch, the memory breakdown
and the series every exporter reads. No torch import; the sources registry is handed over by the
composition root.

``breakdown_service.py`` ``MemoryBreakdownWatch``: the memory breakdown on every sampler tick
``breakdown_sources.py`` what the memory breakdown reads besides the tick, from the sources registry
``fork_renewal.py`` what a forked child renews, in two ordered stages
``gpu_identity.py`` torch's ``cuda:N`` matched to NVML's GPUs by UUID (pure)
``growth.py`` the leak detector: is a figure really growing? Theil-Sen trends (pure)
``series_budget.py`` the series budget: which layers a process exports per-layer series for
``leaks.py`` the leak watch: feeds the detector on every tick, turns its trends into series
``memory_breakdown.py`` where the memory goes, per device: components that add up to the total (pure)
``oom_figures.py`` the figures an OOM's cause is decided from, gathered where an OOM is seen
``operation_stats.py`` per-operation histograms and last delta, for the exporters
``operations.py`` operations and phases: named stretches of work with their memory
``ranks.py`` which rank of a distributed job this process is, from what ``torchrun`` sets
``sampled_sources.py`` what the sampler and an operation's ends read, from the sources registry
``sampler.py`` the background sampler: one daemon thread reading every source on an interval
``scrape.py`` ``ScrapeView``: what every exporter reads, with one merge point for the series
``self_counters.py`` the counters memprof-otel keeps of itself (export errors, dumps, OOMs, ...)
``series.py`` the latest figures as labelled series: the one data path every exporter reads
``started.py`` what a service built once reads of the objects each start builds anew

Public: ``memprof_otel.current_operation()`` (the operations ``memprof_otel.operation()`` opens),
``GET /v1/status``, ``/v1/timeline``, ``/v1/leaks`` and ``/v1/memory``, ``/healthz``, the
operation, leak, memory-breakdown and self-monitoring families, and the ``sampler.*``,
``leaks.*`` and ``series.*`` config. The module paths are internal.
"""
