"""Which layers a process exports per-layer series for: the fleet's series budget, pure.

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
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping

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


__all__ = ["ALL", "AUTO", "KUBERNETES_ENV", "TOP", "Keep", "exports_every_layer", "host_share",
           "restrict_series", "restrict_view", "top_layers"]
