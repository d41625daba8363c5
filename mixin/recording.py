"""The fleet recording rules: per-layer series folded across the processes (pods) of one model.

One process exports ~5 series per layer (peak increase, peak allocated, retained, forward time's
_count/_sum); a fleet of 1,000 pods serving the same model multiplies that by 1,000. These rules
keep one series per (cluster, namespace, job, model, layer, device) for each figure, so dashboards
and long-term storage read a few hundred series instead of hundreds of thousands (a federating or
remote-writing Prometheus can keep only ``namespace_model_layer_device:.*``).

What is folded away is what tells the processes of one deployment apart (instance, pod, rank,
container, ...). What is kept is what tells deployments apart: a model name is the team's choice,
so "enc" in namespace "search" and "enc" in namespace "ads", or in two clusters behind one Thanos,
are two fleets and must not fold into one max. ``by (...)`` of a label a series lacks simply leaves
it out, so the same rules serve a plain Prometheus with no cluster or namespace label.

Names follow Prometheus' ``level:metric:operations`` convention: the level is the labels the
result keeps, with the cluster and job implicit as in the kube-prometheus mixins (they name the
Prometheus and the scrape the series came from, not an aggregation level), the metric the input's
name, the operations what was done.

Every input selector goes through ``series(...)`` with the configured ``selector``; the outputs
carry no per-process labels (instance, pod), so a query on them must not repeat it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .promql import number, series

LEVEL = "namespace_model_layer_device"


def kept_labels(cfg: dict[str, Any]) -> tuple[str, ...]:
    """The labels every recorded series keeps, outermost first (the configured cluster and
    namespace label names)."""
    return (cfg["cluster_label"], cfg["namespace_label"], "job", "model", "layer", "device")


@dataclass(frozen=True)
class RecordingRule:
    record: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)
    comment: str = ""            # why the rule is written this way (a comment in the file)


def name(metric: str, operation: str) -> str:
    """``namespace_model_layer_device:<metric>:<operation>``."""
    return f"{LEVEL}:{metric}:{operation}"


def rate_op(window: str) -> str:
    """The operation part of a rate over ``window``: ``sum_rate5m``."""
    return f"sum_rate{window}"


def mean_op(window: str) -> str:
    return f"mean{window}"


def rules(cfg: dict[str, Any]) -> list[RecordingRule]:
    """The recording rules, in evaluation order (the mean reads the two rates recorded before it)."""
    r = cfg["recording"]
    if not r["enabled"]:
        return []
    sel, q, w = cfg["selector"], number(r["quantile"]), r["window"]
    by = ", ".join(kept_labels(cfg))

    def s(metric: str) -> str:
        return series(metric, sel)

    out = []
    for metric in ("memprof_layer_peak_increase_bytes", "memprof_layer_retained_bytes"):
        out.append(RecordingRule(
            name(metric, "max"), f"max by ({by}) ({s(metric)})",
            comment="The worst process of the model: what a pod must be sized for."
            if metric.endswith("increase_bytes") else ""))
        out.append(RecordingRule(
            name(metric, "quantile"), f"quantile by ({by}) ({q}, {s(metric)})", labels={"quantile": q},
            comment=f"The {q} quantile across the processes: a max far above it is a few outliers\n"
                    "(other inputs, another GPU), not the model." if metric.endswith("increase_bytes") else ""))
    out.append(RecordingRule(
        name("memprof_layer_peak_increase_bytes", "count"),
        f"count by ({by}) ({s('memprof_layer_peak_increase_bytes')})",
        comment="How many processes export the layer: every process of the model for the root module\n"
                "(layer \"\"); fewer for a layer that is only in some processes' top layers\n"
                "(series.layers: top)."))
    out.append(RecordingRule(name("memprof_layer_peak_allocated_bytes", "max"),
                             f"max by ({by}) ({s('memprof_layer_peak_allocated_bytes')})"))
    for part in ("sum", "count"):
        metric = f"memprof_layer_forward_seconds_{part}"
        out.append(RecordingRule(
            name(metric, rate_op(w)), f"sum by ({by}) (rate({s(metric)}[{w}]))",
            comment="Summed over the processes, then divided below: the mean over every attributed call\n"
                    "of the fleet, each process weighted by its calls." if part == "sum" else ""))
    out.append(RecordingRule(
        name("memprof_layer_forward_seconds", mean_op(w)),
        f"{name('memprof_layer_forward_seconds_sum', rate_op(w))}\n"
        f"  / {name('memprof_layer_forward_seconds_count', rate_op(w))}",
        comment="Mean duration of one attributed forward call of the layer across the fleet (NaN while no\n"
                "call was attributed in the window)."))
    return out


def groups(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The rule groups as Prometheus reads them (empty when recording is disabled)."""
    built = rules(cfg)
    if not built:
        return []
    group: dict[str, Any] = {"name": cfg["recording"]["group_name"]}
    if cfg["recording"]["interval"]:
        group["interval"] = cfg["recording"]["interval"]
    group["rules"] = [{"record": r.record, "expr": r.expr, **({"labels": dict(r.labels)} if r.labels else {})}
                      for r in built]
    return [group]


def names(cfg: dict[str, Any]) -> list[str]:
    return [r.record for r in rules(cfg)]
