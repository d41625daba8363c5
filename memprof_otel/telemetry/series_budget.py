"""Which layers a process exports per-layer series for: the fleet's series budget.

A 12-layer GPT-2 tracks 151 modules: five per-layer families make ~780 of a process's ~840 series,
and a fleet of 1,000 such pods would hand one Prometheus ~840,000. Replicas of one deployment run
the same model, so the per-layer series repeat from pod to pod, and what a fleet view shows is the
few layers that dominate. So in ``top`` mode a process exports per-layer series for its root and
its ``top_layers`` layers with the highest peak increase (all-time, so the set settles after the
first forwards and series do not churn with each window), passing over containers whose peak their
children explain (a model's ``transformer``, the root's own figure again; a block, its MLP's peak
plus the hidden states): the layers kept are those doing the work. Any layer flagged as a leak
suspect or named by the advice is exported too; every layer stays in ``/v1/layers``, dumps and
captures. ``auto`` (the default) is ``top`` in a Kubernetes pod and ``all`` elsewhere: a laptop,
the demo and compose keep every layer.
``full_detail_fraction`` of the hosts, chosen by a hash of the host name (stable per pod), export
every layer anyway, so the fleet still sees each layer somewhere.

The functions are pure; ``SeriesBudget`` applies them to the live models, handed to it as functions
(the live handles, the leak suspects, the advised layers, the series config in force), for the
scrape and the OTel recorder.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import time
from collections.abc import Iterable, Mapping
from typing import Any, Callable

from .._log import rate_limited
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


def parents(paths: Iterable[str]) -> dict[str, str]:
    """Layer path -> its nearest tracked ancestor (``""``, the root, for a top-level layer): a
    layer beyond ``max_depth`` or excluded is skipped over, so its children hang from the
    ancestor that holds their memory."""
    tracked = set(paths)
    out = {}
    for p in tracked:
        if not p:
            continue
        parent, q = "", p
        while "." in q:
            q = q.rsplit(".", 1)[0]
            if q in tracked:
                parent = q
                break
        out[p] = parent
    return out


def containers(peak_increase: Mapping[str, int], retained: Mapping[str, int]) -> frozenset[str]:
    """The layers with children that add nothing their children's or their parent's series do not
    show, so ``top`` mode passes over them:

    - those whose peak their children explain: at most the largest child's peak plus what all
      the children keep (``retained``: their outputs, alive while a later child peaks). A block
      ``h.0`` is its MLP's peak over the hidden states ln_1, attn and ln_2 returned; an MLP, its
      activation's peak over what c_fc returned. A layer with a transient of its own beyond that
      (an attention module computing its attention matrix itself, between its projections) is
      not one.
    - those whose peak is their parent's, exactly, where the parent is not passed over itself
      (GPT-2's ``transformer`` is the root's figure, whose series the root always has).

    Leaves never are: where a leaf's figure is its parent's, the parent is passed over instead."""
    parent_of = parents(peak_increase)
    children: dict[str, list[str]] = {}
    for p, parent in parent_of.items():
        children.setdefault(parent, []).append(p)
    explained = set()
    for p, kids in children.items():
        if not p or p not in peak_increase:
            continue
        if peak_increase[p] <= max(peak_increase[k] for k in kids) + sum(max(0, retained.get(k, 0)) for k in kids):
            explained.add(p)
    same = {p for p in children if p and parent_of[p] not in explained
            and peak_increase[p] == peak_increase.get(parent_of[p])}
    return frozenset(explained | same)


def top_layers(peak_increase: Mapping[str, int], k: int,
               suspects: frozenset[str] = frozenset(),
               retained: Mapping[str, int] | None = None) -> frozenset[str]:
    """The root, the ``k`` other layers with the highest peak increase and every layer in
    ``suspects`` (flagged as leaking, or named by the advice: never hidden by rank). With
    ``retained`` (per layer), containers (``containers()``) are passed over: the layers kept are
    those doing the work. Ties: the deeper layer first (the more specific), then path order."""
    skip = containers(peak_increase, retained) if retained is not None else frozenset()
    ranked = sorted((p for p in peak_increase if p and p not in skip),
                    key=lambda p: (-peak_increase[p], -p.count("."), p))
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


class SeriesBudget:
    """The series budget of this process: which layers each live model exports, the budget's own
    gauges, and what ``/v1/status`` says of it. ``config``: the series config in force;
    ``handles``: the live models by name; ``suspects``: model -> the layers the leak watch flags;
    ``advised``: model -> the layers the advice names (each exported whatever its rank, so a
    dashboard shows the layer an alert's advice points at)."""

    def __init__(self, config: Callable[[], SeriesConfig], handles: Callable[[], Mapping[str, ModelHandle]],
                 suspects: Callable[[], Mapping[str, frozenset[str]]],
                 advised: Callable[[], Mapping[str, frozenset[str]]] = dict) -> None:
        self._config = config
        self._handles = handles
        self._suspects = suspects
        self._advised = advised
        # (when, series config, each live model's attributed forwards, the layers each exports)
        self._keep_cache: tuple[float, SeriesConfig, dict[str, int], Keep | None] | None = None
        # series in the last /metrics answer (memprof_series_exported; None before the first)
        self.series_exported: int | None = None

    def exports_every_layer(self) -> bool:
        c = self._config()
        return exports_every_layer(c.layers, c.full_detail_fraction, socket.gethostname(), os.environ)

    def _advised_layers(self) -> Mapping[str, frozenset[str]]:
        """The advised layers; a failure of the advice rules costs their pinning, never the scrape."""
        try:
            return self._advised()
        except Exception as e:
            rate_limited.warning("advised-layers", "memprof_otel: the advised layers could not be read (%r); "
                                 "top mode exports the top layers and leak suspects only", e)
            return {}

    def exported_layers(self, model: str | None = None) -> Keep | None:
        """Model -> the layers it exports per-layer series for (every live model, or ``model``
        alone): the root, the top layers (containers passed over) and the leak suspects and advised
        layers; None when every layer is exported (``series.layers``).

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
            every = self.exports_every_layer()
            suspects = self._suspects() if not every else {}
            advised = self._advised_layers() if not every else {}
            keep = None if every else {
                name: top_layers({p: s.peak_increase for p, s in stats.items()}, c.top_layers,
                                 suspects.get(name, frozenset()) | advised.get(name, frozenset()),
                                 retained={p: s.retained for p, s in stats.items()})
                for name, h in sorted(handles.items()) for stats in (h.layer_stats(),)}
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


__all__ = ["ALL", "AUTO", "KUBERNETES_ENV", "TOP", "Keep", "SeriesBudget", "containers", "exports_every_layer",
           "host_share", "parents", "restrict_series", "restrict_view", "top_layers"]
