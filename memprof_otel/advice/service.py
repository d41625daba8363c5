"""The advice rules over what was already measured: the service around the pure rules, as
``watchdog/service.py`` wraps ``watchdog/engine.py``.

``Advisor.evidence()`` gathers the ``Evidence`` the rules read (the latest sample's allocator
figures, every live model's windowed layer peaks, the leak watch's suspects, capacity facts and
OOM counts) from the objects it was handed; ``report()`` is ``/v1/advice`` and ``mp``'s advice,
``severity_series`` the ``memprof_advice_severity`` family a scrape merges. Reads what was already
measured: starts nothing, touches no device, never changes the process.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, Callable

from .._log import rate_limited
from ..attribution.handle import ModelHandle
from ..attribution.live_handles import live_handles
from ..dumps.service import pick_model
from ..telemetry.scrape import Row, ScrapeContext
from ..telemetry.series import LayerView
from ..telemetry.started import CurrentStart
from .evidence import CapacityFacts, Evidence, LeakSuspect, ModelLayers, OomCauseFacts
from .report import AdviceReport, build_report, severity_by_id
from .rules import advise, advised_layer


class Advisor:
    """``started``: the root's record of the last start (its running sampler and leak watch);
    ``layer_views``: the live models' layer views; ``extra_ooms``: device -> OOMs seen in forwards
    (a live counter); ``last_oom_cause()``: the latest OOM's cause (an ``oom`` record's or an OOM
    kill's post-mortem's)."""

    def __init__(self, started: CurrentStart, layer_views: Callable[[], list[LayerView]],
                 extra_ooms: Mapping[str, int], handles: Callable[[], Mapping[str, ModelHandle]] = live_handles,
                 last_oom_cause: Callable[[], Mapping[str, Any] | None] = lambda: None) -> None:
        self._last_oom_cause = last_oom_cause
        self._started = started
        self._layer_views = layer_views
        self._extra_ooms = extra_ooms
        self._handles = handles

    def capacity_facts(self, views: list[LayerView] | None = None) -> list[CapacityFacts]:
        """Per model and device: the memory it may use, what is in use, the peak predicted for the
        largest recent request and the largest safe batch per sequence length. The capacity model
        fills it: a model that cannot answer yet (too few shapes, no limit known) has none, and the
        near-limit advice stays silent about it. ``views``: the layer views a scrape already took
        (their figures, not computed again)."""
        views = self._layer_views() if views is None else views
        out = []
        for v in views:
            f = v.capacity
            if f is None or f.budget is None or f.headroom is None or f.predicted_peak is None:
                continue
            b = f.budget
            out.append(CapacityFacts(v.model, f.device, b.limit, b.usable_bytes, b.in_use_bytes, int(f.predicted_peak),
                                     int(f.headroom), dict(f.max_safe_batch), limit_bytes=b.limit_bytes,
                                     held_elsewhere_bytes=b.held_elsewhere_bytes, margin_bytes=b.margin_bytes))
        return out

    def advised_layers(self) -> dict[str, frozenset[str]]:
        """Model -> the layers layer-transient-peak names: over the window figures the advice reads
        now, and over every attributed forward (the all-time figures the series budget ranks by,
        so the layer stays named between windows). The series budget exports them whatever their
        rank: a dashboard must show the layer the advice points at."""
        out = {}
        for name, h in self._handles().items():
            named = {advised_layer({k: f.peak_increase for k, f in h.exported_layer_peaks().items()}),
                     advised_layer({k: s.peak_increase for k, s in h.layer_stats().items()})}
            kept = frozenset(p for p in named if p is not None)
            if kept:
                out[name] = kept
        return out

    def evidence(self, views: list[LayerView] | None = None) -> Evidence:
        """What the advice rules read, taken now. ``views``: the layer views a scrape already took."""
        run = self._started()
        sampler = run.sampler
        latest = sampler.latest() if sampler is not None else None
        views = self._layer_views() if views is None else views
        models = [ModelLayers(v.model, v.device, {k: f.peak_increase for k, f in v.peaks.items()})
                  for v in views if v.peaks]  # no attributed forward yet: nothing to cite
        watch = run.leaks
        running = sampler is not None and sampler.running
        watching = watch is not None and watch.cfg.enabled and running
        suspects = [LeakSuspect(s["source"], s["model"], s["layer"], s["device"],
                                float(s["trend"]["slope_bytes_per_second"]), float(s["trend"]["growth_bytes"]),
                                float(s["trend"]["window_seconds"]), s["last_bytes"])
                    for s in (watch.report(1)["suspects"] if watching and watch is not None else [])]
        return Evidence(sampled=latest is not None, allocators=dict(latest.allocators) if latest is not None else {},
                        models=tuple(models), instrumented=tuple(sorted(v.model for v in views)), leak_watch=watching,
                        leak_suspects=tuple(suspects), capacity=tuple(self.capacity_facts(views)),
                        extra_ooms=dict(self._extra_ooms), oom_cause=self.oom_cause())

    def oom_cause(self) -> OomCauseFacts | None:
        """The latest OOM's cause as the rules read it (its byte figures and safe batch)."""
        doc = self._last_oom_cause()
        if not doc or not isinstance(doc.get("cause"), str):
            return None
        figs = doc.get("figures") or {}
        numbers = {k: float(v) for k, v in figs.items()
                   if k.endswith("_bytes") and isinstance(v, (int, float)) and not isinstance(v, bool)}
        n = figs.get("max_safe_batch")
        return OomCauseFacts(doc["cause"], str(doc.get("summary", "")), str(doc.get("knob", "")),
                             str(doc.get("source", "oom")), str(doc.get("model") or ""), str(doc.get("device") or ""),
                             doc.get("time"), numbers, n if isinstance(n, int) else None,
                             doc.get("dump_id") if isinstance(doc.get("dump_id"), str) else None)

    def report(self, model: str | None = None, min_severity: str = "info") -> AdviceReport:
        """The advice rules over ``evidence()``: at or above ``min_severity`` (ValueError for an
        unknown one); with ``model``, about that model and its device (UnknownModel for a model not
        instrumented). Never changes the process: acting on it is the caller's choice."""
        device = None
        live = self._handles()
        if model is not None:
            pick_model(live, model)  # raises UnknownModel, naming the models there are
            device = live[model].last_device
        report = build_report(self.evidence(), model, min_severity, device)
        return replace(report, notes=report.notes + tuple(_capacity_notes(live, model)))

    def severity_series(self, scrape: ScrapeContext) -> Mapping[str, Iterable[Row]]:
        """``memprof_advice_severity``: each firing rule's level, over the scrape's layer views (a
        series contributor). A rule that fails never costs the scrape."""
        try:
            levels = severity_by_id(advise(self.evidence(scrape.views)))
        except Exception as e:
            rate_limited.warning("advice-series", "memprof_otel: the advice rules failed (%r); "
                                 "memprof_advice_severity left out of this scrape", e)
            levels = {}
        if not levels:
            return {}
        return {"memprof_advice_severity": [({"id": rid}, level) for rid, level in sorted(levels.items())]}


def _capacity_notes(live: Mapping[str, ModelHandle], model: str | None) -> list[str]:
    """A model whose calls give different features is learnt per kind of call, and near-limit reads
    one of them: say so, with the names."""
    out = []
    for name, h in sorted(live.items()):
        cap = h.capacity
        note = cap.model.kinds_note() if cap is not None and model in (None, name) else None
        if note:
            out.append(f"model {name!r}: {note}; near-limit reads the kind with the most forwards")
    return out


__all__ = ["Advisor"]
