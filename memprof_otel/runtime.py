"""The composition root: the one place that builds the process-wide services and wires them.

It owns the sampler, the operations tracker, the exporters, the watchdog, the dump service and the
servers, and hands each one what it needs (functions, counters, the series). Every other module
receives its collaborators as arguments; only this module and the public API (``api.py``) look
up the process runtime. Created on first use (import stays free of side effects).
``instrument()`` and ``operation()`` start it with the config they were given if nothing runs yet;
``start_monitoring(config)`` (re)starts it explicitly. ``shutdown()`` stops everything within a
bounded time and also runs at interpreter exit. In a child forked from a monitored process
(``gunicorn --preload``, ``multiprocessing``) it renews itself: its own identity, exporters and
endpoint (``_watch_forks``).
"""
from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import threading
import time
import weakref
from collections import Counter
from typing import Any, Callable

from ._log import rate_limited
from ._version import __version__
from .advice import (AdviceReport, CapacityFacts, Evidence, LeakSuspect, ModelLayers, advise, build_report,
                     severity_by_id)
from .attribution.handle import ModelHandle
from .attribution.registry import live_handles
from .blackbox.service import BlackBox, span_attributes
from .config import (Config, ConfigError, DumpsConfig, SeriesConfig, load_config_tolerant,
                     service_name_in_effect, service_version_in_effect)
from .dumps.heap_session import HeapProfiler
from .dumps.oom_recorder import OomRecorder
from .dumps.service import DumpService, pick_model
from .errors import ServeError
from .export.exposition_merge import OPENMETRICS
from .export.otel import OtelExporter
from .export.otel_observer import OtelForwardObserver
from .export.prometheus import make_registry, render_exposition
from .export.worker_snapshots import SnapshotWriter
from .http.connection_errors import REASONS as HTTP_CONNECTION_ERROR_REASONS
from .http.server import Server
from .http.workers import parent_is_server
from .sources import registry
from .sources.cuda import available_devices
from .telemetry.leaks import LeakWatch
from .telemetry.operation_stats import OperationStats
from .telemetry.operations import OperationTracker, current_operation
from .telemetry.sampler import Sampler, SourceSpec, check_gpus
from .telemetry.layer_budget import (KUBERNETES_ENV, Keep, exports_every_layer, host_share, restrict_series,
                                     restrict_view, top_layers)
from .telemetry.series import LayerView, SelfView, Series, build_series
from .timeline import OperationRecord, Sample
from .watchdog.adapter import AlertCallback, Watchdog

log = logging.getLogger("memprof_otel")


# An operation's rise is a peak minus its start level, so the start level must not predate it:
# glibc's figure is read at most every ~0.1 s (its cost stays under 0.1 %), and a reading older
# than this is left out of the operation (the live RSS and CUDA readings still measure it).
_HOST_START_MAX_AGE_S = 0.1


class _Probe:
    """Cheap start/end readings for operations: a statm pread, the CUDA allocators' live readings
    and glibc's when it is fresh (a read within its back-off)."""

    def rss(self) -> int:
        p = registry.process()
        return p.reading().allocated if p is not None else 0

    def allocators(self) -> dict[str, int]:
        out: dict[str, int] = {}
        host = registry.host_allocator()
        if host is not None:
            fresh = host.fresh_reading(_HOST_START_MAX_AGE_S)
            if fresh is not None:
                out["cpu"] = fresh.allocated
        for i in _cuda_devices():
            src = registry.cuda_allocator(i)
            if src is not None:
                out[f"cuda:{i}"] = src.reading().allocated
        return out


def _cuda_devices() -> list[int]:
    try:
        return available_devices()
    except Exception:
        return []


def _layer_view(h: ModelHandle) -> LayerView:
    return LayerView(model=h.name, device=h.last_device, peaks=h.exported_layer_peaks(),
                     forward=h.layer_forward_totals(), overhead_seconds=h.overhead_seconds,
                     events_dropped=h.events_dropped, surviving=h.surviving(),
                     unattributed=dict(h.unattributed),
                     capacity=h.capacity.figures(h.last_device) if h.capacity is not None else None)


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


def _torch_version() -> str:
    torch = sys.modules.get("torch")
    return str(getattr(torch, "__version__", "")) if torch is not None else ""


class Runtime:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.config: Config | None = None
        # the config given to start_monitoring(): the default for models instrumented without one.
        # A config adopted from the first instrument() call is not: its per-model overrides
        # (every forward attributed, say) must not leak into the next model.
        self.monitoring_config: Config | None = None
        self.sampler: Sampler | None = None
        self.otel: OtelExporter | None = None
        self.tracker = OperationTracker(_Probe())
        self.op_stats: OperationStats = OperationStats()
        self.tracker.add_end_listener(self._operation_ended)
        # counters start at 0 for the labels every process has, so rate() and alerts see the first
        # increment (a series that appears at 1 hides it) and every family shows from the start
        self.export_errors: Counter[str] = Counter({"prometheus": 0})
        self.dumps: Counter[tuple[str, str]] = Counter({("speedscope", "ok"): 0, ("speedscope", "error"): 0})
        self.extra_ooms: Counter[str] = Counter()
        # (config, samples) of the last sampler stopped, until monitoring starts again
        self._kept: tuple[Config | None, list[Sample]] | None = None
        # configuration values the environment got wrong, each counted and logged once
        self.config_errors: Counter[str] = Counter({"env": 0})
        self._config_errors_seen: set[str] = set()
        # failed connections to our server, by reason; counted from its many connection threads at
        # once (an idle crowd times out together), where an unlocked ``+= 1`` would lose counts
        self.http_connection_errors: Counter[str] = Counter(dict.fromkeys(HTTP_CONNECTION_ERROR_REASONS, 0))
        self._http_connection_errors_lock = threading.Lock()
        self.watchdog: Watchdog | None = None  # rebuilt on every start, with the config's rules
        self.leaks: LeakWatch | None = None    # rebuilt on every start, with the config's leaks section
        self.alert_callbacks: list[AlertCallback] = []  # add_alert_callback(); kept across restarts
        self.servers: list[Any] = []
        self.dump_service = DumpService(live_handles, self._dumps_config, self.count_dump,
                                        self._service_name)
        # Python-heap diffs on demand (POST /v1/heap): nothing traced until asked, stopped at shutdown
        self.heap = HeapProfiler(lambda: self.dump_service.store, self.count_dump)
        # forward observers every connected handle gets: the OOM flight recorder, the OTel recorder
        self.oom_recorder = OomRecorder(self.samples, self.tracker.records, self._count_oom,
                                        self.dump_service.store_json)
        self.otel_observer = OtelForwardObserver(lambda: self.otel, self.count_export_error, _layer_view,
                                                 self.exported_layers)
        # the black box: this process's last seconds in a file a SIGKILL leaves behind, and the
        # post-mortems of the processes that left theirs (blackbox/)
        self.blackbox = BlackBox(self.dump_service.store_json, _operation_name,
                                 lambda doc: self._span_event("memprof.postmortem", span_attributes(doc)))
        self.snapshots: SnapshotWriter | None = None  # single-port mode: this worker's series file
        self._otel_providers: tuple[Any, Any] = (None, None)  # the providers start_monitoring() was given
        self._fork_hooks: set[str] = set()
        self.started_unix = 0.0
        self._atexit = False
        self._series_cache: tuple[float, Series] | None = None
        # series in the last /metrics answer (memprof_series_exported; None before the first)
        self.series_exported: int | None = None
        # (when, series config, each live model's attributed forwards, the layers each exports)
        self._keep_cache: tuple[float, SeriesConfig, dict[str, int], Keep | None] | None = None
        self._shutdown_hooks: list[Callable[[float], None]] = []

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.sampler is not None and self.sampler.running

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
            self._config_error(source, err)
        return cfg

    def _config_error(self, source: str, err: ConfigError) -> None:
        seen = f"{source}:{err}"
        with self._lock:
            if seen in self._config_errors_seen:
                return
            self._config_errors_seen.add(seen)
            self.config_errors[source] += 1
        log.warning("memprof_otel: configuration value ignored (the config file's value, else the "
                    "default, stays in force): %s", err)

    def _start(self, cfg: Config, *, meter_provider: Any = None, tracer_provider: Any = None) -> None:
        self._watch_forks("state")
        prev, self.config = self.config, cfg
        self._series_cache = None  # a restart must not serve the previous run's figures
        self.op_stats.max_names = cfg.prometheus.max_operations
        sampler = Sampler(self._source_specs(), cfg.sampler.interval, cfg.sampler.buffer_size,
                          current_operation=self.tracker.current_name)
        kept, self._kept = self._kept, None
        if kept is not None and kept[0] == cfg:  # a restart with the same settings continues the history
            sampler.seed(kept[1])
        sampler.add_listener(self.tracker.observe)
        # a restart with other OTel settings (endpoint, interval...) replaces our exporter
        otel_changed = self.otel is not None and prev is not None and (
            prev.otel != cfg.otel or prev.service_name != cfg.service_name)
        if cfg.otel.enabled and (self.otel is None or otel_changed or meter_provider or tracer_provider):
            self._otel_providers = (meter_provider, tracer_provider)
            self._start_otel(cfg, meter_provider, tracer_provider)
        self.tracker.spans = self.otel
        # before the watchdog's listener: a rule on a growth metric sees this tick's trends
        self.leaks = LeakWatch(cfg.leaks, _surviving_bytes, _survivor_tables)
        sampler.add_listener(self.leaks.on_sample)
        self.watchdog = Watchdog(cfg.watchdog, series=lambda: self.series(max_age_s=0.0),
                                 span_event=self._span_event, dump_all=self._dump_all,
                                 count_dump=self.count_dump, callbacks=self.alert_callbacks,
                                 count_error=self.count_export_error)
        sampler.add_listener(self.watchdog.on_sample)
        self._start_snapshots(cfg, sampler)
        self.blackbox.start(cfg.blackbox, self._service_name(), cfg.sampler.interval)
        sampler.add_listener(self.blackbox.on_sample)
        self.sampler = sampler
        self.started_unix = time.time()
        sampler.start()
        self._watch_forks("services")  # after sampler.start(): see _watch_forks
        if not self._atexit:
            atexit.register(self.shutdown, 3.0)
            atexit.register(self.blackbox.mark_exiting)  # runs first: the exit began
            self._atexit = True

    def _start_snapshots(self, cfg: Config, sampler: Sampler) -> None:
        """Single-port mode (``workers.snapshot_dir``): write this process's series on sampler ticks."""
        if self.snapshots is not None:
            self.snapshots.remove()
            self.snapshots = None
        folder = cfg.workers.snapshot_dir
        if folder is None:
            return
        registry = make_registry(self, layers=False)  # layer families: the fast writer, as a scrape
        self.snapshots = SnapshotWriter(folder, cfg.workers.snapshot_interval,
                                        lambda: render_exposition(self, registry, OPENMETRICS)[0],
                                        self.count_export_error)
        self.export_errors.setdefault("worker_snapshot", 0)
        sampler.add_listener(self.snapshots.on_sample)

    # ---- pre-fork servers (gunicorn --preload, multiprocessing) --------------------------------
    def _watch_forks(self, stage: str) -> None:
        """Two at-fork hooks, each registered once (at the first start: importing stays free of side
        effects). At-fork hooks run in the order they were registered, and the sampler registers
        its own at its first start, re-arming its thread in the child: ``"state"`` (registered
        before that) gives the child fresh locks and counters before the sampler thread can touch
        them; ``"services"`` (after) renews exporters and the endpoint, and finds the sampler
        running. A weak reference: a runtime built by a test and dropped is not kept alive."""
        if stage in self._fork_hooks or not hasattr(os, "register_at_fork"):
            return
        ref = weakref.WeakMethod(self._child_state if stage == "state" else self._child_services)

        def hook() -> None:
            if (fn := ref()) is not None:
                try:
                    fn()
                except Exception as e:  # the child must start, whatever happens to telemetry
                    rate_limited.warning("fork", "memprof_otel: renewing monitoring after fork failed: %r", e)
        os.register_at_fork(after_in_child=hook)
        self._fork_hooks.add(stage)

    def _child_state(self) -> None:
        """A forked child inherits the parent's locks (maybe held by a thread it does not have)
        and its counters (events of the parent: each child would count them again)."""
        self._lock = threading.RLock()
        self._http_connection_errors_lock = threading.Lock()
        self._series_cache = None
        self.tracker.after_fork()
        self.op_stats.after_fork()  # the parent's operations are the parent's series
        for counter in (self.export_errors, self.dumps, self.http_connection_errors):
            for key in counter:
                counter[key] = 0
        self.extra_ooms.clear()
        if self.snapshots is not None:
            self.snapshots.after_fork()

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
            self.count_export_error("otel_setup")
            rate_limited.warning("otel-fork", "memprof_otel: renewing OpenTelemetry after fork failed: %r", e)
        self._renew_servers_in_child(cfg)

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

    def _renew_servers_in_child(self, cfg: Config) -> None:
        for srv in list(self.servers):
            if not isinstance(srv, Server):
                continue
            if cfg.workers.snapshot_dir is not None:
                srv.resume_in_child()  # any process answers on the one port, with every worker's series
                continue
            srv.release_in_child()
            host, port, token, count, shared = srv.requested
            if count > 1:  # a port per worker: this child takes the next free one of the range
                try:
                    Server(self, host, port, token, port_count=count, shared=shared)
                except ServeError as e:
                    log.warning("memprof_otel: this worker (pid %d) serves no endpoint: %s", os.getpid(), e)
            else:  # a server's worker hears it; a DataLoader or pool worker need not
                log.log(logging.WARNING if parent_is_server() else logging.DEBUG,
                        "memprof_otel: the endpoint on %s was started before this worker (pid %d) was "
                        "forked; it stays with process %d and this worker serves none. Set "
                        "workers.snapshot_dir to serve every worker's series on that port, or "
                        "http.port_count to give each worker a port of its own.",
                        srv.url, os.getpid(), os.getppid())

    def _start_otel(self, cfg: Config, meter_provider: Any, tracer_provider: Any) -> None:
        try:
            if self.otel is not None:
                self.otel.shutdown(1.0)
            self.otel = OtelExporter(cfg.otel, cfg.service_name, self.series, self.count_export_error,
                                     meter_provider=meter_provider, tracer_provider=tracer_provider)
            for err in self.otel.ignored_env:  # a bad OTEL_* value: logged once, counted, default kept
                self._config_error("env", err)
            if self.otel.endpoint:
                for name in ("otlp_metrics", "otlp_traces"):
                    self.export_errors.setdefault(name, 0)
        except Exception as e:  # telemetry setup must not take the model down with it
            self.otel = None
            self.count_export_error("otel_setup")
            rate_limited.warning("otel-setup", "memprof_otel: OpenTelemetry setup failed: %r", e)

    def _source_specs(self) -> list[SourceSpec]:
        specs: list[SourceSpec] = []
        if (p := registry.process()) is not None:
            specs.append(SourceSpec("process", p.stats))
        if (cg := registry.cgroup()) is not None:
            specs.append(SourceSpec("cgroup", cg.stats))
        if (h := registry.host_allocator()) is not None:
            specs.append(SourceSpec("cpu", h.stats))
        for i in _cuda_devices():
            if (c := registry.cuda_allocator(i)) is not None:
                specs.append(SourceSpec(f"cuda:{i}", c.stats))
        nvml_fn = getattr(registry, "nvml", None)
        if nvml_fn is not None and (n := nvml_fn()) is not None:
            specs.append(SourceSpec("nvml", n.readings, check_gpus))
        return specs

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

    def _dumps_config(self) -> DumpsConfig | None:
        cfg = self.config
        return cfg.dumps if cfg is not None else None

    def _service_name(self) -> str:
        cfg = self.config
        return service_name_in_effect(cfg.service_name if cfg is not None else None, os.environ)

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

    def discard_samples(self) -> None:
        """Forget a stopped sampler's samples (a test's isolation; a new run with other settings
        does it by itself)."""
        self._kept = None

    def _history(self) -> tuple[list[Sample], list[OperationRecord]]:
        return self.samples(), self.tracker.records()

    def _count_oom(self, device: str) -> None:
        self.extra_ooms[device] += 1

    def _span_event(self, name: str, attributes: dict[str, Any]) -> None:
        if self.otel is not None:
            self.otel.span_event(name, attributes)

    def _dump_all(self, reason: str) -> None:
        self.dump_service.capture_all(reason=reason, forwards=1, timeout=60.0)

    def stop_monitoring(self, timeout: float = 2.0) -> bool:
        with self._lock:
            return self._stop(timeout)

    def _stop(self, timeout: float) -> bool:
        sampler, self.sampler = self.sampler, None
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
            if self.snapshots is not None:  # a worker that ends leaves the single-port view at once
                self.snapshots.remove()  # (and writes no more, though the sampler ticks on a moment)
                self.snapshots = None
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
                self._series_cache = None
                ok &= otel.shutdown(max(0.1, deadline - time.monotonic() - 0.5))
            ok &= self._stop(min(2.0, max(0.1, deadline - time.monotonic())))
            self.blackbox.shutdown()  # a clean end leaves no black box behind
            self.config = None  # the next start takes the config it is given afresh
            self.monitoring_config = None
        return ok

    # ---- counters --------------------------------------------------------------------------
    def count_export_error(self, exporter: str) -> None:
        self.export_errors[exporter] += 1

    def count_dump(self, fmt: str, result: str) -> None:
        self.dumps[(fmt, result)] += 1

    def count_http_connection_error(self, reason: str) -> None:
        with self._http_connection_errors_lock:
            self.http_connection_errors[reason] += 1

    def _operation_ended(self, rec: OperationRecord) -> None:
        label = self.op_stats.record(rec)
        if self.otel is not None and label is not None:
            self.otel.record_operation(rec, label)

    def operations_tracker(self) -> OperationTracker:
        if not self.running:
            self.ensure_started()
        return self.tracker

    # ---- advice ----------------------------------------------------------------------------
    def capacity_facts(self, views: list[LayerView] | None = None) -> list[CapacityFacts]:
        """Per model and device: the memory it may use, what is in use, the peak predicted for the
        largest recent request and the largest safe batch per sequence length. The capacity model
        fills it: a model that cannot answer yet (too few shapes, no limit known) has none, and the
        near-limit advice stays silent about it. ``views``: the layer views a scrape already took
        (their figures, not computed again)."""
        views = self.layer_views() if views is None else views
        out = []
        for v in views:
            f = v.capacity
            if f is None or f.budget is None or f.headroom is None or f.predicted_peak is None:
                continue
            out.append(CapacityFacts(v.model, f.device, f.budget.limit, f.budget.usable_bytes, f.budget.in_use_bytes,
                                     int(f.predicted_peak), int(f.headroom), dict(f.max_safe_batch)))
        return out

    def advice_evidence(self, views: list[LayerView] | None = None) -> Evidence:
        """What the advice rules read, taken now: the latest sample's allocator figures, every live
        model's windowed layer peaks, the leak watch's suspects, capacity facts and OOM counts.
        Reads what was already measured; starts nothing and touches no device. ``views``: the
        layer views a scrape already took."""
        latest = self.sampler.latest() if self.sampler is not None else None
        views = self.layer_views() if views is None else views
        models = [ModelLayers(v.model, v.device, {k: f.peak_increase for k, f in v.peaks.items()})
                  for v in views if v.peaks]  # no attributed forward yet: nothing to cite
        watch = self.leaks
        watching = watch is not None and watch.cfg.enabled and self.running
        suspects = [LeakSuspect(s["source"], s["model"], s["layer"], s["device"],
                                float(s["trend"]["slope_bytes_per_second"]), float(s["trend"]["growth_bytes"]),
                                float(s["trend"]["window_seconds"]), s["last_bytes"])
                    for s in (watch.report(1)["suspects"] if watching and watch is not None else [])]
        return Evidence(sampled=latest is not None, allocators=dict(latest.allocators) if latest is not None else {},
                        models=tuple(models), instrumented=tuple(sorted(v.model for v in views)), leak_watch=watching,
                        leak_suspects=tuple(suspects), capacity=tuple(self.capacity_facts(views)),
                        extra_ooms=dict(self.extra_ooms))

    def advice(self, model: str | None = None, min_severity: str = "info") -> AdviceReport:
        """The advice rules over ``advice_evidence()``: at or above ``min_severity`` (ValueError
        for an unknown one); with ``model``, about that model and its device (UnknownModel for a
        model not instrumented). Never changes the process: acting on it is the caller's choice."""
        device = None
        if model is not None:
            live = live_handles()
            pick_model(live, model)  # raises UnknownModel, naming the models there are
            device = live[model].last_device
        return build_report(self.advice_evidence(), model, min_severity, device)

    # ---- the one data path exporters read --------------------------------------------------
    def layer_views(self) -> list[LayerView]:
        return [_layer_view(h) for _, h in sorted(live_handles().items())]

    def sources_up(self) -> dict[str, bool]:
        up = {name: False for name in registry.down_reasons()}
        if self.sampler is not None:
            up.update(self.sampler.up)
        if up.get("nvml") and "nvml_process" not in up:  # NVML answers and can see this process
            up["nvml_process"] = True
        return up

    def self_view(self) -> SelfView:
        s = self.sampler
        return SelfView(
            sources_up=self.sources_up(),
            sampler_errors=dict(s.errors) if s is not None else {},
            sampler_duration_s=s.last_duration_s if s is not None and s.ticks else None,
            sampler_last_success=s.last_success_unix if s is not None else None,
            export_errors=dict(self.export_errors), dumps=dict(self.dumps),
            extra_ooms=dict(self.extra_ooms), config_errors=dict(self.config_errors),
            http_connection_errors=dict(self.http_connection_errors),
            version=__version__, torch_version=_torch_version(),
            service_version=service_version_in_effect(os.environ))

    def series(self, max_age_s: float = 0.25, views: list[LayerView] | None = None,
               per_layer: bool = True) -> Series:
        """Every gauge/counter/info series, built from the latest sample; cached for ``max_age_s``
        so one OTel collection (many callbacks) or one scrape builds it once. ``views``: the
        ``layer_views()`` the caller already took (a scrape needs them for the summary too)."""
        now = time.monotonic()
        cached = self._series_cache
        if cached is not None and now - cached[0] < max_age_s and per_layer:
            return cached[1]
        latest = self.sampler.latest() if self.sampler is not None else None
        me = self.self_view()
        if latest is not None and any(d.startswith("cuda:") for d in latest.allocators):
            # UUIDs are read once torch has initialised CUDA (never earlier), then cached
            me.cuda_uuids = registry.cuda_uuids()
        views = self.layer_views() if views is None else views
        out = build_series(latest, views, me, per_layer)
        if self.watchdog is not None:
            for name, rows in self.watchdog.series().items():
                out.setdefault(name, []).extend(rows)
        if self.leaks is not None:
            for name, rows in self.leaks.series().items():
                out.setdefault(name, []).extend(rows)
        for name, rows in self.blackbox.series().items():
            out.setdefault(name, []).extend(rows)
        for op, f in sorted(self.op_stats.snapshot().items()):
            out.setdefault("memprof_operation_memory_delta_bytes", []).append(({"operation": op}, f.last_delta))
        try:  # the advice rules over what was just measured: a rule that fails never costs the scrape
            levels = severity_by_id(advise(self.advice_evidence(views)))
        except Exception as e:
            rate_limited.warning("advice-series", "memprof_otel: the advice rules failed (%r); "
                                 "memprof_advice_severity left out of this scrape", e)
            levels = {}
        for rid, level in sorted(levels.items()):
            out.setdefault("memprof_advice_severity", []).append(({"id": rid}, level))
        out = self._series_budget(out, views)
        if per_layer:
            self._series_cache = (now, out)
        return out

    # ---- the series budget -------------------------------------------------------------------
    def _series_config(self) -> SeriesConfig:
        return self.config.series if self.config is not None else SeriesConfig()

    def exports_every_layer(self) -> bool:
        c = self._series_config()
        return exports_every_layer(c.layers, c.full_detail_fraction, socket.gethostname(), os.environ)

    def exported_layers(self, model: str | None = None) -> Keep | None:
        """Model -> the layers it exports per-layer series for (every live model, or ``model``
        alone): the root, the top layers and the leak suspects; None when every layer is exported
        (``series.layers``).

        The choice reads every model's statistics (0.5 ms for a 151-layer model) and is asked for
        three times a scrape and at every attributed forward (the OTel recorder), while the all-time
        ranking it follows settles after the first forwards: so it is made again only after
        ``_KEEP_MAX_AGE_S``, when the config or the live models change, or when a model that had
        no attributed forward when it was made has one now."""
        c = self._series_config()
        handles = live_handles()
        counts = {name: h.scheduler.state().attributed for name, h in handles.items()}
        cached = self._keep_cache
        now = time.monotonic()
        if (cached is None or cached[1] is not c or cached[2].keys() != counts.keys()
                or now - cached[0] >= _KEEP_MAX_AGE_S
                or any(cached[2][n] == 0 < counts[n] for n in counts)):
            suspects = self.leaks.suspected_layers() if self.leaks is not None else {}
            keep = None if self.exports_every_layer() else {
                name: top_layers({p: s.peak_increase for p, s in h.layer_stats().items()}, c.top_layers,
                                 suspects.get(name, frozenset()))
                for name, h in sorted(handles.items())}
            cached = self._keep_cache = (now, c, counts, keep)
        keep = cached[3]
        if keep is None or model is None:
            return keep
        return {model: keep[model]} if model in keep else {}

    def exported_layer_views(self, views: list[LayerView] | None = None) -> list[LayerView]:
        """``layer_views()`` with the per-layer figures of the exported layers only."""
        views = self.layer_views() if views is None else views
        keep = self.exported_layers()
        if keep is None:
            return views
        return [restrict_view(v, keep[v.model]) if v.model in keep else v for v in views]

    def series_status(self) -> dict[str, Any]:
        """What ``/v1/status`` says of the series budget: the mode, why this host exports every
        layer or not, and the layers each model exports."""
        c = self._series_config()
        keep = self.exported_layers()
        return {"layers": c.layers, "every_layer": keep is None,
                "in_kubernetes": KUBERNETES_ENV in os.environ, "full_detail_fraction": c.full_detail_fraction,
                "host": socket.gethostname(), "host_share": host_share(socket.gethostname()),
                "exported_layers": {m: sorted(paths) for m, paths in keep.items()} if keep is not None else None,
                "series_exported": self.series_exported, "budget": c.budget}

    def record_series_exported(self, n: int) -> None:
        self.series_exported = n

    def _series_budget(self, out: Series, views: list[LayerView]) -> Series:
        """Per-layer rows of unexported layers left out; the budget's own gauges added."""
        keep = self.exported_layers()
        if keep is not None:
            out = restrict_series(out, keep)
        for v in views:
            tracked = set(v.peaks) | set(v.forward)
            exported = len(tracked) if keep is None or v.model not in keep else len(tracked & keep[v.model])
            out.setdefault("memprof_layers_tracked", []).append(({"model": v.model}, len(tracked)))
            out.setdefault("memprof_layers_exported", []).append(({"model": v.model}, exported))
        out.setdefault("memprof_series_budget", []).append(({}, self._series_config().budget))
        if self.series_exported is not None:
            out.setdefault("memprof_series_exported", []).append(({}, self.series_exported))
        return out


# how long exported_layers() reuses its choice (seconds)
_KEEP_MAX_AGE_S = 1.0

_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                _runtime = Runtime()
    return _runtime
