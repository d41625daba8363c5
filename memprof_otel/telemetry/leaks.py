"""Leak watch: feeds the growth detector on every sampler tick and turns its trends into series.

Three kinds of series are fitted (``growth.py``): the process RSS, each allocator's allocated
bytes, and each layer's surviving bytes (storages born in attributed forwards still alive, read
from the instrumentations through the function it is handed). What the sampler sample holds is the
figure of that tick; surviving bytes are read at the tick.

Series published (names in ``metric_names``): the slopes as
``memprof_memory_growth_bytes_per_second{source,device}`` and
``memprof_layer_growth_bytes_per_second{model,layer,device}`` once a trend exists, and
``memprof_memory_leak_suspected{source,device}`` and ``memprof_layer_leak_suspected{model,layer,device}``
(0 or 1) for every series watched, from its first reading, so an alert sees it go from 0 to 1.
Each flag has exactly the labels of the slope it qualifies: no label that is empty by construction.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..config import LeaksConfig
from ..timeline import Sample
from .growth import GrowthDetector, GrowthParams, Trend

Labels = dict[str, str]
SurvivingFn = Callable[[], Mapping[tuple[str, str, str], int]]  # (model, layer, device) -> bytes
TablesFn = Callable[[], Mapping[str, Mapping[str, int]]]        # model -> survivor table counts

PROCESS, ALLOCATOR, LAYER = "process", "allocator", "layer"


class WatchKey(NamedTuple):
    source: str   # process | allocator | layer
    model: str    # "" unless source is layer
    layer: str    # "" unless source is layer
    device: str   # "" for the process


def params_of(cfg: LeaksConfig) -> GrowthParams:
    return GrowthParams(floor_interval=cfg.floor_interval, trend_window=cfg.trend_window, warmup=cfg.warmup,
                        min_growth_rate=cfg.min_growth_rate, min_growth_bytes=float(cfg.min_growth_bytes),
                        confidence=cfg.confidence)


def readings_of(sample: Sample, surviving: Mapping[tuple[str, str, str], int]) -> dict[WatchKey, float]:
    """The figures of one tick, keyed by what they measure."""
    out: dict[WatchKey, float] = {}
    rss = sample.process.get("resident_memory_bytes")
    if rss is not None:
        out[WatchKey(PROCESS, "", "", "")] = float(rss)
    for device, figures in sample.allocators.items():
        if "allocated_bytes" in figures:
            out[WatchKey(ALLOCATOR, "", "", device)] = float(figures["allocated_bytes"])
    for (model, layer, device), n in surviving.items():
        out[WatchKey(LAYER, model, layer, device)] = float(n)
    return out


class LeakWatch:
    """A sampler listener (``on_sample``) plus what the exporters and ``/v1/leaks`` read."""

    def __init__(self, cfg: LeaksConfig, surviving: SurvivingFn, tables: TablesFn = dict) -> None:
        self.cfg = cfg
        self._surviving = surviving
        self._tables = tables
        self._lock = threading.Lock()
        self._detector = GrowthDetector(params_of(cfg))
        self._last: dict[WatchKey, float] = {}

    def on_sample(self, sample: Sample) -> None:
        if not self.cfg.enabled:
            return
        readings = readings_of(sample, self._surviving())
        with self._lock:
            self._detector.observe_all(sample.t, readings)
            self._last = readings

    def trends(self) -> dict[WatchKey, Trend]:
        with self._lock:
            return self._detector.trends()  # type: ignore[return-value]

    def suspected_layers(self) -> dict[str, frozenset[str]]:
        """Model -> its layers flagged as leak suspects now (what the series budget always exports)."""
        out: dict[str, set[str]] = {}
        for k, tr in self.trends().items():
            if k.source == LAYER and tr.suspected:
                out.setdefault(k.model, set()).add(k.layer)
        return {m: frozenset(layers) for m, layers in out.items()}

    def _current(self) -> tuple[list[WatchKey], dict[Any, Trend], Mapping[tuple[str, str, str], int]]:
        """Keys watched, their trends, and the surviving bytes now. Layers follow the surviving
        bytes now, not at the last tick: an uninstrumented model's series leave at once, a new
        layer's flag shows at once (0)."""
        live = self._surviving()
        with self._lock:
            keys: list[WatchKey] = self._detector.keys()  # type: ignore[assignment]
            trends = self._detector.trends()
        keys = [k for k in keys if k.source != LAYER]
        if self.cfg.enabled:
            keys += [WatchKey(LAYER, m, layer, d) for (m, layer, d) in live]
        return keys, trends, live

    def series(self) -> dict[str, list[tuple[Labels, float]]]:
        keys, trends, _ = self._current()
        out: dict[str, list[tuple[Labels, float]]] = {
            "memprof_memory_growth_bytes_per_second": [], "memprof_layer_growth_bytes_per_second": [],
            "memprof_memory_leak_suspected": [], "memprof_layer_leak_suspected": []}
        for k in sorted(keys):
            tr = trends.get(k)
            flag = 1.0 if tr is not None and tr.suspected else 0.0
            if k.source == LAYER:
                lab = {"model": k.model, "layer": k.layer, "device": k.device}
                growth, suspected = "memprof_layer_growth_bytes_per_second", "memprof_layer_leak_suspected"
            else:
                lab = {"source": k.source, "device": k.device}
                growth, suspected = "memprof_memory_growth_bytes_per_second", "memprof_memory_leak_suspected"
            if tr is not None:
                out[growth].append((lab, tr.slope))
            out[suspected].append((lab, flag))
        return out

    def report(self, top: int) -> dict[str, Any]:
        """What ``GET /v1/leaks`` answers: suspects, every trend, and the top surviving layers."""
        keys, trends, live = self._current()
        with self._lock:
            last = dict(self._last)
        watched = []
        for k in sorted(keys):
            tr = trends.get(k)
            watched.append({**_labels(k), "last_bytes": last.get(k),
                            "trend": tr.to_dict() if tr is not None else None,
                            "suspected": bool(tr is not None and tr.suspected)})
        surviving = sorted(live.items(), key=lambda kv: (-kv[1], kv[0]))  # now, not at the last tick
        return {
            "enabled": self.cfg.enabled,
            "suspects": [w for w in watched if w["suspected"]],
            "series": watched,
            "top_surviving_layers": [{"model": m, "layer": layer, "device": d, "surviving_bytes": int(v)}
                                     for (m, layer, d), v in surviving[:top]],
            # per model: storages held, the bound, and survivors left out (the figure is then a
            # lower bound)
            "survivor_tables": {m: dict(c) for m, c in sorted(self._tables().items())},
            "params": {"floor_interval_seconds": self.cfg.floor_interval,
                       "trend_window_seconds": self.cfg.trend_window, "warmup_seconds": self.cfg.warmup,
                       "min_growth_rate_bytes_per_second": self.cfg.min_growth_rate,
                       "min_growth_bytes": self.cfg.min_growth_bytes, "confidence": self.cfg.confidence},
        }


def _labels(k: WatchKey) -> Labels:
    return {"source": k.source, "model": k.model, "layer": k.layer, "device": k.device}
