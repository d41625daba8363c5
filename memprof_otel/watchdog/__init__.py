"""The watchdog: threshold rules over the scraped series, the pure alert engine that evaluates them,
and the service that runs it on every sampler tick.

``service.py`` the engine run on every sampler tick, and its actions (log, span event, callback, dump)
``engine.py`` Prometheus-style alert states for the rules: a pure state machine over scraped values
``rules.py`` what a rule is and how a rule mapping is validated (pure: the config reads it)

Public: ``GET /v1/alerts``, ``GET``/``PUT /v1/watchdog/rules``, ``memprof_otel.add_alert_callback()``
and ``remove_alert_callback()``, the ``memprof_alert_active`` and ``memprof_watchdog_*`` families and
the ``watchdog.*`` config. The module paths are internal.
"""
