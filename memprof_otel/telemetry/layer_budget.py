"""Which layers a process exports per-layer series for: the fleet's series budget.

A 12-layer GPT-2 tracks 151 modules: five per-layer families make ~780 of a process's ~840 series,
and a fleet of 1,000 such pods would hand one Prometheus ~840,000. Replicas of one deployment run
the same model, so the per-layer series repeat from pod to pod, and what a fleet view shows is the
few layers that dominate. So in ``top`` mode a process exports per-layer series for its root and
its ``top_layers`` layers with the highest peak increase (all-time, so the set settles after the
first forwards and series do not churn with each window), and for any layer flagged as a leak
suspect; every layer stays in ``/v1/layers``, dumps and captures. ``auto`` (the default) is
``top`` in a Kubernetes pod and ``all`` elsewhere: a laptop, the demo and compose keep every layer.
``full_detail_fraction`` of the hosts, chosen by a hash of the host name (stable per pod), export
every layer anyway, so the fleet still sees each layer somewhere.

The functions are pure; ``LayerBudget`` applies them to the live models, handed to it as functions
(the live handles, the leak suspects, the series config in force), for the scrape and the OTel
recorder.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import time
from collections.abc import Mapping
from typing import Any, Callable

from ..attribution.handle import ModelHandle
from ..config import SeriesConfig
from .series import LayerView, Series

ALL, TOP, AUTO = "all", "top", "auto"

# Kubernetes sets this in every container of a pod (the API server's address): the sign that the
# process is one of many replicas scraped by a shared Prometheus
KUBERNETES_ENV = "KUBERNETES_SERVICE_HOST"

Keep = Mapping[str, frozenset[str]]  # model -> the layer paths whose series are exported


def exports_every_layer(mode: str, fraction: float, host: str, environ: Mapping[str, str]) -> bool:
    """Does this process export every layer? ``mode`` all/top/auto; in top mode a host whose name
    hashes below ``fraction`` does anyway."""
    if mode == ALL or (mode == AUTO and KUBERNETES_ENV not in environ):
        return True
    return host_share(host) < fraction


def host_share(host: str) -> float:
    """A number in [0, 1) fixed by ``host``: the same on every restart of a pod, uniform over a
    fleet's names (the first 8 bytes of its SHA-256)."""
    digest = hashlib.sha256(host.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / float(1 << 64)


def top_layers(peak_increase: Mapping[str, int], k: int,
               suspects: frozenset[str] = frozenset()) -> frozenset[str]:
    """The root, the ``k`` other layers with the highest peak increase (ties: path order) and every
    layer in ``suspects`` (flagged as leaking: a leak is never hidden by rank)."""
    ranked = sorted((p for p in peak_increase if p), key=lambda p: (-peak_increase[p], p))
    return frozenset(["", *ranked[:k], *suspects])


def restrict_view(view: LayerView, keep: frozenset[str]) -> LayerView:
    """``view`` with the per-layer figures of ``keep`` only."""
    return dataclasses.replace(
        view, peaks={p: f for p, f in view.peaks.items() if p in keep},
        forward={p: f for p, f in view.forward.items() if p in keep},
        surviving={k: n for k, n in view.surviving.items() if k[0] in keep})


def restrict_series(series: Series, keep: Keep) -> Series:
    """``series`` without the per-layer rows (labelled ``model`` and ``layer``) of layers outside
    ``keep``. Models absent from ``keep`` keep every row."""
    return {name: [(lab, v) for lab, v in rows
                   if "layer" not in lab or lab.get("model") not in keep or lab["layer"] in keep[lab["model"]]]
            for name, rows in series.items()}


# how long exported_layers() reuses its choice (seconds)
_KEEP_MAX_AGE_S = 1.0


class LayerBudget:
    """The series budget of this process: which layers each live model exports, the budget's own
    gauges, and what ``/v1/status`` says of it. ``config``: the series config in force;
    ``handles``: the live models by name; ``suspects``: model -> the layers the leak watch flags."""

    def __init__(self, config: Callable[[], SeriesConfig], handles: Callable[[], Mapping[str, ModelHandle]],
                 suspects: Callable[[], Mapping[str, frozenset[str]]]) -> None:
        self._config = config
        self._handles = handles
        self._suspects = suspects
        # (when, series config, each live model's attributed forwards, the layers each exports)
        self._keep_cache: tuple[float, SeriesConfig, dict[str, int], Keep | None] | None = None
        # series in the last /metrics answer (memprof_series_exported; None before the first)
        self.series_exported: int | None = None

    def exports_every_layer(self) -> bool:
        c = self._config()
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
        c = self._config()
        handles = self._handles()
        counts = {name: h.attributed_forwards for name, h in handles.items()}
        cached = self._keep_cache
        now = time.monotonic()
        if (cached is None or cached[1] is not c or cached[2].keys() != counts.keys()
                or now - cached[0] >= _KEEP_MAX_AGE_S
                or any(cached[2][n] == 0 < counts[n] for n in counts)):
            suspects = self._suspects()
            keep = None if self.exports_every_layer() else {
                name: top_layers({p: s.peak_increase for p, s in h.layer_stats().items()}, c.top_layers,
                                 suspects.get(name, frozenset()))
                for name, h in sorted(handles.items())}
            cached = self._keep_cache = (now, c, counts, keep)
        keep = cached[3]
        if keep is None or model is None:
            return keep
        return {model: keep[model]} if model in keep else {}

    def exported_layer_views(self, views: list[LayerView]) -> list[LayerView]:
        """``views`` with the per-layer figures of the exported layers only."""
        keep = self.exported_layers()
        if keep is None:
            return views
        return [restrict_view(v, keep[v.model]) if v.model in keep else v for v in views]

    def status(self) -> dict[str, Any]:
        """What ``/v1/status`` says of the series budget: the mode, why this host exports every
        layer or not, and the layers each model exports."""
        c = self._config()
        keep = self.exported_layers()
        return {"layers": c.layers, "every_layer": keep is None,
                "in_kubernetes": KUBERNETES_ENV in os.environ, "full_detail_fraction": c.full_detail_fraction,
                "host": socket.gethostname(), "host_share": host_share(socket.gethostname()),
                "exported_layers": {m: sorted(paths) for m, paths in keep.items()} if keep is not None else None,
                "series_exported": self.series_exported, "budget": c.budget}

    def record_series_exported(self, n: int) -> None:
        self.series_exported = n

    def apply(self, out: Series, views: list[LayerView]) -> Series:
        """Per-layer rows of unexported layers left out; the budget's own gauges added."""
        keep = self.exported_layers()
        if keep is not None:
            out = restrict_series(out, keep)
        for v in views:
            tracked = set(v.peaks) | set(v.forward)
            exported = len(tracked) if keep is None or v.model not in keep else len(tracked & keep[v.model])
            out.setdefault("memprof_layers_tracked", []).append(({"model": v.model}, len(tracked)))
            out.setdefault("memprof_layers_exported", []).append(({"model": v.model}, exported))
        out.setdefault("memprof_series_budget", []).append(({}, self._config().budget))
        if self.series_exported is not None:
            out.setdefault("memprof_series_exported", []).append(({}, self.series_exported))
        return out


__all__ = ["ALL", "AUTO", "KUBERNETES_ENV", "TOP", "Keep", "LayerBudget", "exports_every_layer", "host_share",
           "restrict_series", "restrict_view", "top_layers"]
