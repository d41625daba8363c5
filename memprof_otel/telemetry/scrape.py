"""The scrape view: what every exporter reads (the Prometheus collector, the OTel callbacks, the
watchdog), with one merge point for the series.

``ScrapeView.series()`` builds the series from the latest sample, the live models' layer views and
the self-counters (``series.build_series``), then asks each registered contributor for its rows and
merges them, as prometheus_client's ``CollectorRegistry`` asks each collector: the watchdog's, the
leak watch's, the operations' and the advice's families are each one registration in the
composition root, and a new family is one more (``contribute``), not an edit here. Last, the series
budget (``series_budget.SeriesBudget``) leaves out the rows of the layers this process does not export
and adds its own gauges. Nothing here reads a device.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Callable, Protocol

from .._log import rate_limited
from .._version import __version__
from ..attribution.handle import ModelHandle
from ..attribution.live_handles import live_handles
from ..config import Config, service_version_in_effect
from ..timeline import Sample
from .fork_renewal import STATE
from .series_budget import SeriesBudget
from .operation_stats import OperationStats
from .self_counters import SelfCounters
from .series import FRAMEWORKS, Labels, LayerView, SelfView, Series, build_series
from .started import CurrentStart

Row = tuple[Labels, float]


@dataclass(frozen=True)
class ScrapeContext:
    """What a contributor may read of the scrape it contributes to (taken once for all of them)."""
    views: list[LayerView]   # every live model's layer view, all layers (the budget applies later)
    latest: Sample | None    # the sampler's latest sample (None before the first, or not sampling)


# A contributor: the rows of its families, by Prometheus name (each a ``metric_names`` entry), for
# one scrape. Called on the reading thread (a scrape, an OTel collection, a watchdog tick), after
# the built-in families; one that raises costs the series its rows only (logged, rate-limited).
SeriesContributor = Callable[[ScrapeContext], Mapping[str, Iterable[Row]]]


def ignoring_context(rows: Callable[[], Mapping[str, Iterable[Row]]]) -> SeriesContributor:
    """A contributor from a function that needs nothing of the scrape (``Watchdog.series``)."""
    return lambda _scrape: rows()


def layer_view(h: ModelHandle) -> LayerView:
    return LayerView(model=h.name, device=h.last_device, peaks=h.exported_layer_peaks(),
                     forward=h.layer_forward_totals(), overhead_seconds=h.overhead_seconds,
                     events_dropped=h.events_dropped, surviving=h.surviving(),
                     unattributed=dict(h.unattributed),
                     capacity=h.capacity.figures(h.last_device) if h.capacity is not None else None)


class SourceStates(Protocol):
    """What the scrape asks of the sources registry (``sources/registry.py``; the module itself is
    one): the sources down here, with why, and torch's CUDA device UUIDs (read once CUDA is up)."""

    def down_reasons(self) -> Mapping[str, str]: ...
    def cuda_uuids(self) -> Mapping[int, str]: ...


def framework_versions() -> dict[str, str]:
    """Framework -> version, for each of FRAMEWORKS this process has imported (never imports one)."""
    return {name: str(getattr(sys.modules[name], "__version__", "")) for name in FRAMEWORKS if name in sys.modules}


class ScrapeView:
    """``started``: the root's record of the last start (its config in force and running sampler);
    ``sources``: the sources registry's states; ``frameworks``: framework -> version, of those in
    use (the build info's)."""
    # ``op_stats`` and ``count_export_error`` are the collector's too (``export.prometheus.ScrapeSource``)

    def __init__(self, started: CurrentStart, counters: SelfCounters, op_stats: OperationStats,
                 budget: SeriesBudget, sources: SourceStates,
                 frameworks: Callable[[], Mapping[str, str]] = framework_versions,
                 handles: Callable[[], Mapping[str, ModelHandle]] = live_handles) -> None:
        self._started = started
        self._counters = counters
        self._frameworks = frameworks
        self._sources = sources
        self._handles = handles
        self.op_stats = op_stats
        self.budget = budget
        self.count_export_error = counters.count_export_error
        self._contributors: dict[str, SeriesContributor] = {}
        self._cache: tuple[float, Series] | None = None
        STATE.add(self.forget)  # a forked child's figures are its own from the first scrape

    # ---- the merge point -------------------------------------------------------------------
    def contribute(self, name: str, rows: SeriesContributor) -> None:
        """Merge ``rows(scrape)`` into every series built from now on. ``name`` is the contribution's
        own (``"watchdog"``): registering it again replaces the earlier function in its place."""
        self._contributors[name] = rows
        self._cache = None

    def withdraw(self, name: str) -> None:
        """Stop merging the contribution registered as ``name`` (nothing when there is none)."""
        self._contributors.pop(name, None)
        self._cache = None

    def forget(self) -> None:
        """Drop the cached series: the next reader builds them (a restart, a fork, a final flush)."""
        self._cache = None

    # ---- what exporters read ---------------------------------------------------------------
    def layer_views(self) -> list[LayerView]:
        return [layer_view(h) for _, h in sorted(self._handles().items())]

    def exported_layer_views(self, views: list[LayerView] | None = None) -> list[LayerView]:
        """``layer_views()`` with the per-layer figures of the exported layers only."""
        return self.budget.exported_layer_views(self.layer_views() if views is None else views)

    def record_series_exported(self, n: int) -> None:
        self.budget.record_series_exported(n)

    @property
    def config(self) -> Config | None:
        """The config in force (None before the first start): the collector reads its series section."""
        return self._started().config

    def exports_every_layer(self) -> bool:
        return self.budget.exports_every_layer()

    def sources_up(self) -> dict[str, bool]:
        up = {name: False for name in self._sources.down_reasons()}
        s = self._started().sampler
        if s is not None:
            up.update(s.up)
        if up.get("nvml") and "nvml_process" not in up:  # NVML answers and can see this process
            up["nvml_process"] = True
        return up

    def self_view(self) -> SelfView:
        s = self._started().sampler
        c = self._counters
        return SelfView(
            sources_up=self.sources_up(),
            sampler_errors=dict(s.errors) if s is not None else {},
            sampler_duration_s=s.last_duration_s if s is not None and s.ticks else None,
            sampler_last_success=s.last_success_unix if s is not None else None,
            export_errors=dict(c.export_errors), dumps=dict(c.dumps),
            extra_ooms=dict(c.extra_ooms), config_errors=dict(c.config_errors),
            http_connection_errors=dict(c.http_connection_errors),
            version=__version__, frameworks=dict(self._frameworks()),
            service_version=service_version_in_effect(os.environ))

    def series(self, max_age_s: float = 0.25, views: list[LayerView] | None = None,
               per_layer: bool = True) -> Series:
        """Every gauge/counter/info series, built from the latest sample; cached for ``max_age_s``
        so one OTel collection (many callbacks) or one scrape builds it once. ``views``: the
        ``layer_views()`` the caller already took (a scrape needs them for the summary too)."""
        now = time.monotonic()
        cached = self._cache
        if cached is not None and now - cached[0] < max_age_s and per_layer:
            return cached[1]
        s = self._started().sampler
        latest = s.latest() if s is not None else None
        me = self.self_view()
        if latest is not None and any(d.startswith("cuda:") for d in latest.allocators):
            # UUIDs are read once torch has initialised CUDA (never earlier), then cached
            me.cuda_uuids = self._sources.cuda_uuids()
        views = self.layer_views() if views is None else views
        out = build_series(latest, views, me, per_layer)
        scrape = ScrapeContext(views, latest)
        for name, rows in list(self._contributors.items()):
            try:
                contributed = rows(scrape)
            except Exception as e:  # one family's failure never costs the others
                rate_limited.warning(f"contributor:{name}", "memprof_otel: the %s series failed (%r); "
                                     "left out of this scrape", name, e)
                continue
            for family, family_rows in contributed.items():
                out.setdefault(family, []).extend(family_rows)
        out = self.budget.apply(out, views)
        if per_layer:
            self._cache = (now, out)
        return out


__all__ = ["Row", "ScrapeContext", "ScrapeView", "SeriesContributor", "SourceStates", "framework_versions",
           "ignoring_context", "layer_view"]
