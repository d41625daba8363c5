"""The composition root: the one place that builds the process-wide services and wires them.

It has two lifetimes. The services built once, in ``Runtime.__init__`` (the operations tracker, the
scrape view, the series budget, the advice, the dump service, the memory breakdown, the OOM
recorder, the black box), live as long as the process. What each start builds anew with its config
(the sampler, the leak watch, the watchdog, the single-port snapshot writer) is one record,
``Started``, replaced whole by every start, stop and shutdown; the services built once read it
through one getter (``telemetry/started.py``), never through a reference of their own that a
restart would leave stale. Every family of series beside the built-in ones is registered in one
place, ``Runtime._register_series`` (the scrape view, ``telemetry/scrape.py``, merges them). Every
other module receives its collaborators as arguments; only this module and the public API
(``api.py``) look up the process runtime. Created on first use (import stays free of side effects).
``instrument()`` and ``operation()`` start it with the config they were given if nothing runs yet;
``start_monitoring(config)`` (re)starts it explicitly. ``shutdown()`` stops everything within a
bounded time and also runs at interpreter exit. In a child forked from a monitored process
(``gunicorn --preload``, ``multiprocessing``) it renews itself in two ordered stages
(``telemetry/fork_renewal.py``): its own state first, then exporters and the endpoint.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable

from ._log import rate_limited
from .advice.service import Advisor
from .attribution.handle import ModelHandle
from .attribution.live_handles import live_handles
from .blackbox.service import BlackBox, span_attributes
from .config import Config, DumpsConfig, SeriesConfig, load_config_tolerant, service_name_in_effect
from .dumps.heap_session import HeapProfiler
from .dumps.oom_recorder import FlightSources, OomRecorder
from .dumps.service import DumpService
from .dumps.store import sweep_gone
from .export.exposition_merge import OPENMETRICS
from .export.otel import OtelExporter
from .export.otel_observer import OtelForwardObserver
from .export.prometheus import make_registry, render_exposition
from .export.worker_snapshots import SnapshotWriter, process_alive
from .http.connection_errors import REASONS as HTTP_CONNECTION_ERROR_REASONS
from .http.server import renew_servers_in_child
from .sources import mmap_threshold, registry
from .telemetry.breakdown_service import MemoryBreakdownWatch
from .telemetry.breakdown_sources import RegistrySources
from .telemetry.fork_renewal import SERVICES, STATE
from .telemetry.series_budget import SeriesBudget
from .telemetry.leaks import LeakWatch
from .telemetry.operation_stats import OperationStats
from .telemetry.oom_figures import OomExplainer, flight_prediction, host_leak
from .telemetry.operations import OperationTracker, current_operation
from .telemetry.sampled_sources import SampledSources
from .telemetry.sampler import Sampler
from .telemetry.scrape import Row, ScrapeView, ignoring_context, layer_view
from .telemetry.self_counters import SelfCounters
from .telemetry.started import NOT_STARTED, StartedView
from .timeline import OperationRecord, Sample
from .watchdog.service import AlertCallback, Watchdog

log = logging.getLogger("memprof_otel")


def _operation_name() -> str | None:
    """The innermost operation the calling context runs in (a captured forward's), if any."""
    rec = current_operation()
    return rec.name if rec is not None else None


def _surviving_bytes() -> dict[tuple[str, str, str], int]:
    """(model, layer, device) -> surviving bytes, over every live instrumented model."""
    return {(name, layer, device): n for name, h in live_handles().items()
            for (layer, device), n in h.surviving().items()}


def _survivor_tables() -> dict[str, dict[str, int]]:
    """Model -> its survivor table's counts (held, capacity, left out), where one is kept."""
    return {name: h.survivors.counts() for name, h in live_handles().items() if h.survivors is not None}


def _shutdown_failed(what: str, e: Exception) -> None:
    # shutdown goes on with the other parts and returns False; without this line nothing would
    # say which part failed, or why
    log.warning("memprof_otel: shutdown: %s failed: %r", what, e, exc_info=e)


def _service_name_of(cfg: Config | None) -> str:
    return service_name_in_effect(cfg.service_name if cfg is not None else None, os.environ)


def _shutdown_at_exit(ref: "weakref.ref[Runtime]") -> None:
    rt = ref()
    if rt is not None:
        rt.shutdown(3.0)


@dataclass(frozen=True)
class Started:
    """What one start builds anew, with its config. Never changed in place: a start replaces it
    with the next; a stop, with the same less its sampler (what it sampled is kept for the
    reports); a shutdown, less its snapshot writer and its config too. The leak watch and the
    watchdog stay until the next start: their reports (``/v1/leaks``, ``/v1/alerts``) still answer."""

    config: Config | None            # the config in force; None after a shutdown
    sampler: Sampler | None          # the running sampler; None once stopped
    leaks: LeakWatch
    watchdog: Watchdog
    snapshots: SnapshotWriter | None  # single-port mode (workers.snapshot_dir): this worker's series file
    started_unix: float


class Runtime:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        # ---- per start: what the last start built (None before the first), read through
        # _current(); the properties below (config, sampler, leaks, ...) read it too
        self._started: Started | None = None
        # (config, samples) of the last sampler stopped, until monitoring starts again
        self._kept: tuple[Config | None, list[Sample]] | None = None
        # ---- kept across starts, each for its own reason
        # the config given to start_monitoring(): the default for models instrumented without one.
        # A config adopted from the first instrument() call is not: its per-model overrides
        # (every forward attributed, say) must not leak into the next model.
        self.monitoring_config: Config | None = None
        # replaced only when a start brings other OTel settings or providers, renewed in a forked child
        self.otel: OtelExporter | None = None
        self._otel_providers: tuple[Any, Any] = (None, None)  # the providers start_monitoring() was given
        self.alert_callbacks: list[AlertCallback] = []  # add_alert_callback(); every start's watchdog calls them
        self.servers: list[Any] = []
        # ---- built once: the services, each handed what it reads
        self.counters = SelfCounters(HTTP_CONNECTION_ERROR_REASONS)
        self.sources = SampledSources(registry)  # the sampler's sources and the operations' probe
        self.tracker = OperationTracker(self.sources)
        self.op_stats: OperationStats = OperationStats()
        self.tracker.add_end_listener(self._operation_ended)
        # the advice is built after the budget (it reads the scrape, which applies the budget)
        self.budget = SeriesBudget(self._series_config, live_handles, self._leak_suspects,
                                  lambda: self.advisor.advised_layers())
        self.scrape = ScrapeView(self._current, self.counters, self.op_stats, self.budget, registry)
        self.advisor = Advisor(self._current, self.scrape.layer_views, self.counters.extra_ooms,
                               last_oom_cause=self._last_oom_cause)
        self.dump_service = DumpService(live_handles, self._dumps_config, self.counters.count_dump,
                                        self._service_name)
        # Python-heap diffs on demand (POST /v1/heap): nothing traced until asked, stopped at shutdown
        self.heap = HeapProfiler(lambda: self.dump_service.store, self.counters.count_dump)
        # where the memory goes, on every sampler tick (GET /v1/memory, memprof_memory_bytes)
        self.memory = MemoryBreakdownWatch(live_handles, RegistrySources(registry))
        # forward observers every connected handle gets: the OOM flight recorder, the OTel recorder
        self.oom_recorder = OomRecorder(FlightSources(self.samples, self.tracker.records, self.memory.document),
                                        self.counters.count_oom, self.dump_service.store_json,
                                        OomExplainer(self.samples, self._current))
        self.otel_observer = OtelForwardObserver(lambda: self.otel, self.counters.count_export_error, layer_view,
                                                 self.budget.exported_layers)
        # the black box: this process's last seconds in a file a SIGKILL leaves behind, and the
        # post-mortems of the processes that left theirs (blackbox/)
        self.blackbox = BlackBox(self.dump_service.store_json, _operation_name, self._postmortem_event,
                                 flight_prediction(live_handles), host_leak(self._current))
        self._register_series()
        self._started_once = False
        self._shutdown_hooks: list[Callable[[float], None]] = []
        # a forked child: fresh locks and no parent's operations before the sampler's thread re-arms
        # (fork_renewal.STATE), renewed exporters and endpoint after (SERVICES, added at the first start)
        STATE.add(self._child_state)

    def _register_series(self) -> None:
        """Every family of series beside the built-in ones (``telemetry/series.py``), one
        registration each: a new family is registered here, after its row in ``metric_names.py``."""
        scrape = self.scrape
        scrape.contribute("operations", ignoring_context(self.op_stats.delta_series))
        scrape.contribute("advice", self.advisor.severity_series)
        scrape.contribute("memory", self.memory.series)
        scrape.contribute("postmortem", ignoring_context(self.blackbox.series))
        # the last start's leak watch and watchdog, read at each scrape (none before the first start)
        scrape.contribute("leaks", ignoring_context(self._leak_series))
        scrape.contribute("watchdog", ignoring_context(self._watchdog_series))

    # ---- what the last start built -------------------------------------------------------------
    def _current(self) -> StartedView:
        """The record of the last start, as the services built once read it."""
        run = self._started
        return run if run is not None else NOT_STARTED

    @property
    def config(self) -> Config | None:
        return self._current().config

    @property
    def sampler(self) -> Sampler | None:
        return self._current().sampler

    @property
    def leaks(self) -> LeakWatch | None:
        return self._current().leaks

    @property
    def watchdog(self) -> Watchdog | None:
        run = self._started
        return run.watchdog if run is not None else None

    @property
    def snapshots(self) -> SnapshotWriter | None:
        run = self._started
        return run.snapshots if run is not None else None

    @property
    def started_unix(self) -> float:
        run = self._started
        return run.started_unix if run is not None else 0.0

    def _drop(self, **ended: None) -> None:
        """Replace the record of the last start with the same less what a stop or a shutdown ended."""
        run = self._started
        if run is not None:
            self._started = replace(run, **ended)

    def _leak_series(self) -> dict[str, list[Row]]:
        run = self._started
        return run.leaks.series() if run is not None else {}

    def _watchdog_series(self) -> dict[str, list[Row]]:
        run = self._started
        return run.watchdog.series() if run is not None else {}

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        sampler = self.sampler  # read once: a stop may replace the record between two reads
        return sampler is not None and sampler.running

    def ensure_started(self, config: Config | None = None) -> "Runtime":
        """Start with ``config`` unless something already runs (first caller's config wins)."""
        if self.running:
            return self
        with self._lock:
            if not self.running:
                self._start(config if config is not None else self.resolve_config())
        return self

    def start_monitoring(self, config: Any = None, *, meter_provider: Any = None,
                         tracer_provider: Any = None) -> "Runtime":
        cfg = config if isinstance(config, Config) else self.resolve_config(config)
        with self._lock:
            if self.running:
                self._stop(timeout=2.0)
            self._start(cfg, meter_provider=meter_provider, tracer_provider=tracer_provider)
            self.monitoring_config = cfg
        return self

    def resolve_config(self, config: Any = None, **overrides: Any) -> Config:
        """The config to monitor with: what the caller passed is strict (a ConfigError), but an
        unknown or bad environment value never stops monitoring — it is logged once, counted in
        ``memprof_config_errors_total{source}`` and left out (the file's value, else the default, kept)."""
        cfg, ignored = load_config_tolerant(config, **overrides)
        for source, err in ignored:
            self.counters.config_error(source, err)
        return cfg

    def _start(self, cfg: Config, *, meter_provider: Any = None, tracer_provider: Any = None) -> None:
        prev = self.config
        self.scrape.forget()  # a restart must not serve the previous run's figures
        self.op_stats.max_names = cfg.prometheus.max_operations
        sampler = Sampler(self.sources.specs(), cfg.sampler.interval, cfg.sampler.buffer_size,
                          current_operation=self.tracker.current_name)
        kept, self._kept = self._kept, None
        if kept is not None and kept[0] == cfg:  # a restart with the same settings continues the history
            sampler.seed(kept[1])
        sampler.add_listener(self.tracker.observe)
        sampler.add_listener(self.memory.on_sample)  # before the watchdog and the advice read it
        # a restart with other OTel settings (endpoint, interval...) replaces our exporter
        otel_changed = self.otel is not None and prev is not None and (
            prev.otel != cfg.otel or prev.service_name != cfg.service_name)
        if cfg.otel.enabled and (self.otel is None or otel_changed or meter_provider or tracer_provider):
            self._otel_providers = (meter_provider, tracer_provider)
            self._start_otel(cfg, meter_provider, tracer_provider)
        self.tracker.spans = self.otel
        # before the watchdog's listener: a rule on a growth metric sees this tick's trends
        leaks = LeakWatch(cfg.leaks, _surviving_bytes, _survivor_tables)
        sampler.add_listener(leaks.on_sample)
        watchdog = Watchdog(cfg.watchdog, series=lambda: self.scrape.series(max_age_s=0.0),
                            span_event=self._span_event, dump_all=self._dump_all,
                            count_dump=self.counters.count_dump, callbacks=self.alert_callbacks,
                            count_error=self.counters.count_export_error)
        sampler.add_listener(watchdog.on_sample)
        snapshots = self._start_snapshots(cfg, sampler)
        if cfg.capacity.enabled:  # before the forwards the capacity answers are about (sources/mmap_threshold.py)
            mmap_threshold.apply_configured(cfg.capacity.mmap_threshold, cfg.capacity.limit_bytes)
        sampler.add_listener(self.blackbox.on_sample)
        self._started = Started(cfg, sampler, leaks, watchdog, snapshots, time.time())
        # after the config is in force: the black box's scan stores the post-mortems it files as
        # dumps at once, in the folder of the service the config names; before, that was the
        # unnamed default's folder, and a busy machine's scan filed one of two there
        service = _service_name_of(cfg)
        self.blackbox.start(cfg.blackbox, service, cfg.sampler.interval)
        if not cfg.dumps.dir:  # the per-process dump folders of this service's gone processes, by the same retention
            threading.Thread(target=sweep_gone, args=(service, cfg.blackbox.keep, cfg.blackbox.keep_for,
                                                      process_alive), name="memprof-dump-sweep", daemon=True).start()
        sampler.start()
        if not self._started_once:
            # after sampler.start(): the sampler's own at-fork hook is registered by then, so in a
            # child the services are renewed once its thread runs again (fork_renewal.py)
            SERVICES.add(self._child_services)
            atexit.register(_shutdown_at_exit, weakref.ref(self))
            atexit.register(self.blackbox.mark_exiting)  # runs first: the exit began
            self._started_once = True

    def _start_snapshots(self, cfg: Config, sampler: Sampler) -> SnapshotWriter | None:
        """Single-port mode (``workers.snapshot_dir``): write this process's series on sampler ticks."""
        if self.snapshots is not None:  # the last start's file: this start writes its own
            self.snapshots.remove()
        folder = cfg.workers.snapshot_dir
        if folder is None:
            return None
        registry = make_registry(self.scrape, layers=False)  # layer families: the fast writer, as a scrape
        snapshots = SnapshotWriter(folder, cfg.workers.snapshot_interval,
                                   lambda: render_exposition(self.scrape, registry, OPENMETRICS)[0],
                                   self.counters.count_export_error)
        self.counters.expect_exporter("worker_snapshot")
        sampler.add_listener(snapshots.on_sample)
        return snapshots

    def _start_otel(self, cfg: Config, meter_provider: Any, tracer_provider: Any) -> None:
        try:
            if self.otel is not None:
                self.otel.shutdown(1.0)
            self.otel = OtelExporter(cfg.otel, cfg.service_name, self.scrape.series, self.counters.count_export_error,
                                     meter_provider=meter_provider, tracer_provider=tracer_provider)
            for err in self.otel.ignored_env:  # a bad OTEL_* value: logged once, counted, default kept
                self.counters.config_error("env", err)
            if self.otel.endpoint:
                for name in ("otlp_metrics", "otlp_traces"):
                    self.counters.expect_exporter(name)
        except Exception as e:  # telemetry setup must not take the model down with it
            self.otel = None
            self.counters.count_export_error("otel_setup")
            rate_limited.warning("otel-setup", "memprof_otel: OpenTelemetry setup failed: %r", e)

    # ---- pre-fork servers (gunicorn --preload, multiprocessing) --------------------------------
    def _child_state(self) -> None:
        """A forked child inherits the parent's locks (maybe held by a thread it does not have)
        and its operations (the parent's series). The counters and the scrape renew themselves."""
        self._lock = threading.RLock()
        self.tracker.after_fork()
        self.op_stats.after_fork()  # the parent's operations are the parent's series
        snapshots = self.snapshots
        if snapshots is not None:
            snapshots.after_fork()

    def _child_services(self) -> None:
        """A forked child has none of the parent's threads and would otherwise speak as its
        parent (same ``service.instance.id``, the parent's pending exports)."""
        cfg = self.config
        if cfg is None:
            return
        try:
            self._renew_otel_in_child(cfg)
        except Exception as e:
            self.otel = None
            self.tracker.spans = None
            self.counters.count_export_error("otel_setup")
            rate_limited.warning("otel-fork", "memprof_otel: renewing OpenTelemetry after fork failed: %r", e)
        renew_servers_in_child(self)

    def _renew_otel_in_child(self, cfg: Config) -> None:
        old = self.otel
        if old is None or old.endpoint is None:
            return  # providers the application gave (or the global ones): its SDK handles its fork
        self.otel = None
        self._start_otel(cfg, *self._otel_providers)  # a new service.instance.id, new SDK threads
        self.tracker.spans = self.otel
        # the old providers' exporters export nothing in this process (the parent's data, under the
        # parent's identity): shutting them down only ends their threads, in the background
        old.shutdown(0.0)

    # ---- what the services are handed ------------------------------------------------------
    def connect(self, h: ModelHandle) -> None:
        """Start the process runtime (sampler, exporters) with the handle's config unless one runs,
        and hand the handle what the layers above it want of its forwards."""
        self.ensure_started(h.config)
        h.process_history = self._history
        h.current_operation = _operation_name
        h.add_observer(self.oom_recorder)
        h.add_observer(self.otel_observer)
        h.add_flight_listener(self.blackbox)

    def _series_config(self) -> SeriesConfig:
        cfg = self.config
        return cfg.series if cfg is not None else SeriesConfig()

    def _last_oom_cause(self) -> dict[str, Any] | None:
        """The latest OOM's cause: this process's last ``oom`` record or the last OOM kill's post-mortem."""
        found = [c for c in (self.oom_recorder.last_cause(), self.blackbox.last_cause()) if c is not None]
        return max(found, key=lambda c: c.get("time") or 0.0) if found else None

    def _leak_suspects(self) -> dict[str, frozenset[str]]:
        leaks = self.leaks
        return leaks.suspected_layers() if leaks is not None else {}

    def _dumps_config(self) -> DumpsConfig | None:
        cfg = self.config
        return cfg.dumps if cfg is not None else None

    def _service_name(self) -> str:
        return _service_name_of(self.config)

    def samples(self, since_unix: float | None = None) -> list[Sample]:
        """The samples taken: the running sampler's, or, after ``stop_monitoring()``, what it had
        taken (a batch job starts, runs, stops, then reports)."""
        s = self.sampler
        if s is not None:
            return s.samples(since_unix)
        kept = self._kept
        if kept is None:
            return []
        return kept[1] if since_unix is None else [x for x in kept[1] if x.t >= since_unix]

    def _history(self) -> tuple[list[Sample], list[OperationRecord]]:
        return self.samples(), self.tracker.records()

    def _operation_ended(self, rec: OperationRecord) -> None:
        label = self.op_stats.record(rec)
        if self.otel is not None and label is not None:
            self.otel.record_operation(rec, label)

    def operations_tracker(self) -> OperationTracker:
        if not self.running:
            self.ensure_started()
        return self.tracker

    def _span_event(self, name: str, attributes: dict[str, Any]) -> None:
        if self.otel is not None:
            self.otel.span_event(name, attributes)

    def _postmortem_event(self, doc: dict[str, Any]) -> None:
        self._span_event("memprof.postmortem", span_attributes(doc))

    def _dump_all(self, reason: str) -> None:
        self.dump_service.capture_all(reason=reason, forwards=1, timeout=60.0)

    # ---- stopping --------------------------------------------------------------------------
    def stop_monitoring(self, timeout: float = 2.0) -> bool:
        with self._lock:
            return self._stop(timeout)

    def _stop(self, timeout: float) -> bool:
        sampler = self.sampler
        self._drop(sampler=None)
        self.tracker.end_phase()
        if sampler is None:
            return True
        stopped = sampler.stop(timeout)
        # what it sampled stays readable (timeline, report, plot, export_timeline, /v1/timeline)
        # until monitoring starts again: with the same settings it goes on from there
        self._kept = (self.config, sampler.samples())
        return stopped

    def add_shutdown_hook(self, fn: Callable[[float], None]) -> None:
        self._shutdown_hooks.append(fn)

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Stop servers, the sampler and exporters (flushing them) within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        ok = True
        # a heap diff still waiting ends now (its tracing stops) and answers before the servers close,
        # and so does a dump request waiting for forwards (it fails as shutting_down)
        ok &= self.heap.stop(min(2.0, timeout / 2))
        self.dump_service.end_pending()
        with self._lock:
            for srv in list(self.servers):
                try:
                    srv.close()
                except Exception as e:
                    ok = False
                    _shutdown_failed(f"closing the endpoint server at {getattr(srv, 'url', srv)}", e)
            self.servers.clear()
            snapshots = self.snapshots
            if snapshots is not None:  # a worker that ends leaves the single-port view at once
                snapshots.remove()  # (and writes no more, though the sampler ticks on a moment)
                self._drop(snapshots=None)
            for fn in list(self._shutdown_hooks):
                try:
                    fn(max(0.0, deadline - time.monotonic()))
                except Exception as e:
                    ok = False
                    _shutdown_failed(f"shutdown hook {getattr(fn, '__qualname__', None) or repr(fn)}", e)
            self.tracker.end_phase()  # the open phase's span goes out with the final flush
            otel, self.otel = self.otel, None
            self.tracker.spans = None
            if otel is not None:
                # flush while the sampler still holds the latest figures, so the final export has them
                self.scrape.forget()
                ok &= otel.shutdown(max(0.1, deadline - time.monotonic() - 0.5))
            ok &= self._stop(min(2.0, max(0.1, deadline - time.monotonic())))
            self.blackbox.shutdown()  # a clean end leaves no black box behind
            self._drop(config=None)  # the next start takes the config it is given afresh
            self.monitoring_config = None
        return ok


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                _runtime = Runtime()
    return _runtime
