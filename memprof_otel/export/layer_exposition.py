"""The per-layer families written straight to exposition text: the one hot spot of a scrape.

At 1,000 layers the layer families are ~6,000 of a scrape's ~6,030 samples. Through
prometheus_client's generic path (a ``Sample`` tuple per value, then its encoder) a scrape took
32 ms median and ~200 ms p95: the tuples are GC-tracked, so scrapes triggered full collections that
also stall the model's thread on the GIL (docs/benchmarks.md). Here they are formatted as strings
(not GC-tracked), byte for byte what prometheus_client writes for the same families — the same
value formatting (``floatToGoString``), sorted labels and escaping — which the tests check. Text
0.0.4 and OpenMetrics differ here only in OpenMetrics' ``# UNIT`` line after ``# TYPE``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.utils import floatToGoString

from ..metric_names import BY_PROM
from ..telemetry.series import LayerView

LAYER_GAUGES = (("memprof_layer_peak_increase_bytes", "peak_increase"),
                ("memprof_layer_peak_allocated_bytes", "peak_allocated"),
                ("memprof_layer_retained_bytes", "retained"),
                ("memprof_layer_fragmentation_ratio", "fragmentation"))
LAYER_SUMMARY = "memprof_layer_forward_seconds"
LAYER_FAMILIES = frozenset([n for n, _ in LAYER_GAUGES] + [LAYER_SUMMARY])


def _esc(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _head(name: str, kind: str, openmetrics: bool) -> str:
    d = BY_PROM[name]
    unit = f"# UNIT {name} {d.prom_unit}\n" if openmetrics and d.prom_unit else ""
    return f"# HELP {name} {_help(d.help)}\n# TYPE {name} {kind}\n{unit}"


def _around(labels: Mapping[str, str]) -> tuple[str, str]:
    """The constant labels as text before ``device`` and after ``model`` (prometheus_client sorts
    the labels of a sample by name; the layer labels are device < layer < model)."""
    before = "".join(f'{k}="{_esc(v)}",' for k, v in sorted(labels.items()) if k < "device")
    after = "".join(f',{k}="{_esc(v)}"' for k, v in sorted(labels.items()) if k > "model")
    if any("device" <= k <= "model" for k in labels):
        raise ValueError(f"constant labels must sort before 'device' or after 'model': {sorted(labels)}")
    return before, after


def render_layer_families(views: Iterable[LayerView], openmetrics: bool = False,
                          labels: Mapping[str, str] | None = None) -> str:
    """The four per-layer gauges and the forward-time summary as exposition text (with the
    ``# UNIT`` lines when ``openmetrics``), each sample with the constant ``labels`` too."""
    # one pass per family over the views, strings only: no per-sample container survives the call
    g = floatToGoString
    views = list(views)
    before, after = _around(labels or {})
    out: list[str] = []
    for i, (name, _) in enumerate(LAYER_GAUGES):
        out.append(_head(name, "gauge", openmetrics))
        for v in views:
            head = f'{name}{{{before}device="{_esc(v.device)}",layer="'
            tail = f'",model="{_esc(v.model)}"{after}}} '
            for path in sorted(v.peaks):
                value = v.peaks[path][i]
                if value is not None:  # fragmentation is absent where it is not measured
                    out.append(f"{head}{_esc(path)}{tail}{g(value)}\n")
    name = LAYER_SUMMARY
    out.append(_head(name, "summary", openmetrics))
    for v in views:
        lab_head = f'{{{before}device="{_esc(v.device)}",layer="'
        tail = f'",model="{_esc(v.model)}"{after}}} '
        for path in sorted(v.forward):
            seconds, calls = v.forward[path]
            lab = f"{lab_head}{_esc(path)}{tail}"
            out.append(f"{name}_count{lab}{g(calls)}\n{name}_sum{lab}{g(seconds)}\n")
    return "".join(out)
