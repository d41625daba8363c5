"""Summary of one instrumentation: a dict for JSON and a text table for people."""
from __future__ import annotations

from typing import Any, Protocol

from ..units import format_bytes


class SummarySubject(Protocol):
    """What a summary reads from an instrumentation handle (``Instrumentation`` is one)."""

    name: str
    last_device: str
    attribution_method: str  # what the per-layer figures are read from ("tensor ledger", ...)
    forward_errors: int
    hook_errors: int
    events_dropped: int
    scheduler: Any  # .state() -> forwards, attributed, forward_seconds, attribution_seconds, first_*_s

    def layer_stats(self) -> dict[str, Any]: ...


def steady_overhead_ratio(st: Any) -> float | None:
    """Attribution cost / forward time over the forwards after the first one; None before a second.

    The first forward is always attributed and, with no plain forward to compare with, charged its
    whole duration (then, once plain forwards are seen, at most three of them): counted in, it
    reads "100 %" after one forward and stays inflated for a long while. Left out, the figure is what instrumentation costs a running server.

    None too while no forward ran plain (``attribution.overhead_budget: 1.0`` attributes every
    one): an attributed forward's cost is its duration minus a plain one's, and with none to
    compare with each is charged whole, so the ratio would read 100 % without measuring anything.
    """
    if st.forwards < 2 or st.plain_forward_ema_s is None:
        return None
    spent = max(0.0, st.attribution_seconds - st.first_attributed_s)
    plain = max(0.0, st.forward_seconds - st.first_forward_s)
    return spent / (spent + plain) if spent + plain > 0 else 0.0


def overhead_line(forwards: int, attributed: int, steady: float | None, first_s: float) -> str:
    """The summary's overhead sentence, for people: what the figure covers is said with it."""
    head = f"  forwards: {forwards} ({attributed} attributed), overhead: "
    if steady is None and forwards >= 2 and attributed >= forwards:
        return (head + "not measured: every forward was attributed, so none ran plain to compare with "
                "(attribution.overhead_budget 1.0 lets attribution take any share of forward time; it is "
                "a budget, not a measurement: attribution.every_n_forwards 2 or more measures it)")
    if steady is None:
        return (head + f"not measured yet (the first forward is always attributed, once: "
                f"{first_s * 1e3:.2f} ms; the steady figure shows from the second forward)")
    return (head + f"{steady:.3%} of forward time after the first forward (the first forward is "
            f"always attributed and cost {first_s * 1e3:.2f} ms once; attribution.overhead_budget "
            "bounds the rest)")


def summary_dict(h: SummarySubject, top: int = 10) -> dict[str, Any]:
    st = h.scheduler.state()
    stats = h.layer_stats()
    ranked = sorted((s for k, s in stats.items() if k != ""), key=lambda s: s.peak_increase, reverse=True)
    root = stats.get("")
    total_s = st.forward_seconds + st.attribution_seconds
    return {
        "model": h.name,
        "device": h.last_device,
        "method": h.attribution_method,
        "forwards": st.forwards,
        "attributed_forwards": st.attributed,
        "forward_errors": h.forward_errors,
        "overhead_seconds": st.attribution_seconds,
        "overhead_ratio": st.attribution_seconds / total_s if total_s > 0 else 0.0,
        "steady_overhead_ratio": steady_overhead_ratio(st),
        "first_forward_overhead_seconds": st.first_attributed_s,
        "layers_tracked": len(stats),
        "hook_errors": h.hook_errors,
        "events_dropped": h.events_dropped,
        "forward_peak_increase_bytes": root.peak_increase if root else 0,
        "forward_peak_allocated_bytes": root.peak_allocated if root else 0,
        "top_layers": [{"layer": s.layer_name, "peak_increase_bytes": s.peak_increase,
                        "retained_bytes": s.retained, "calls": s.calls} for s in ranked[:top]],
    }


def format_summary(h: SummarySubject, top: int = 15) -> str:
    d = summary_dict(h, top)
    stats = h.layer_stats()
    lines = [
        f"memprof-otel summary: model {d['model']!r} on {d['device']} ({d['method']})",
        overhead_line(d["forwards"], d["attributed_forwards"], d["steady_overhead_ratio"],
                      d["first_forward_overhead_seconds"]),
        f"  forward peak: +{format_bytes(d['forward_peak_increase_bytes'])} "
        f"(level {format_bytes(d['forward_peak_allocated_bytes'])})",
    ]
    if d["hook_errors"] or d["events_dropped"] or d["forward_errors"]:
        lines.append(f"  hook errors: {d['hook_errors']}, events dropped: {d['events_dropped']}, "
                     f"forwards that raised: {d['forward_errors']}")
    rows = sorted((s for k, s in stats.items() if k != ""), key=lambda s: s.peak_increase, reverse=True)[:top]
    if not rows:
        lines.append("  no attributed layer yet (run a forward; see attribution.overhead_budget)")
        return "\n".join(lines)
    width = max(24, *(len(s.layer_name) for s in rows))
    lines.append(f"  {'layer':<{width}} {'calls':>6} {'peak +':>11} {'retained':>11} {'ms/call':>9}")
    for s in rows:
        lines.append(f"  {s.layer_name:<{width}} {s.calls:>6} {format_bytes(s.peak_increase):>11} "
                     f"{format_bytes(s.retained):>11} {s.duration_ms / max(1, s.calls):>9.3f}")
    return "\n".join(lines)
