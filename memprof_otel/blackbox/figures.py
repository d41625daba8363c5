"""What a dead process's black box says about the cause of its end: the figures of
``oom/cause.py``, read from the decoded file alone (pure). The next process has none of the dead
one's live state, so every figure comes from what it wrote: the limit and its ticks (resident
memory, the C heap's in-use bytes, the leak detector's suspect), and beside the forward in flight
its shape, its predicted peak and its largest safe batch (the suspect and the prediction are written
from payload version 2 on; an older file has neither).

The kernel kills for the cgroup's limit, which counts the process's memory on the host: the
figures are the host's. What was held is the resident memory at the last tick before the forward
in flight began; the request's own rise is the C heap's growth since then (tensors on CPU come from
that heap); memory outside the allocator is resident memory outside the heap. A prediction made
for a GPU forward is in the GPU's units and is left out.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..oom.cause import UNKNOWN, Cause, LeakTrend, OomFigures, classify
from .classify import OOM_KILL
from .format import Contents

HOST_UNITS = ("process_resident", "tensor")


def _num(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def resident(s: Mapping[str, Any]) -> int | None:
    return _num((s.get("process") or {}).get("resident_memory_bytes"))


def heap(s: Mapping[str, Any]) -> int | None:
    return _num(((s.get("allocators") or {}).get("cpu") or {}).get("allocated_bytes"))


def outside(s: Mapping[str, Any]) -> int | None:
    """Resident memory outside the C heap at a tick."""
    rss, h = resident(s), heap(s)
    return max(0, rss - h) if rss is not None and h is not None else None


def the_request(c: Contents) -> dict[str, Any] | None:
    """The forward in flight the end is laid to: one during which the limit was reached, else the
    oldest (the one that had longest to grow)."""
    flights = [f for f in c.flight if f.get("limit_reached")] or list(c.flight)
    if not flights:
        return None
    return min(flights, key=lambda f: f.get("started_unix") if isinstance(f.get("started_unix"), (int, float)) else 0.0)


def start_sample(samples: list[dict[str, Any]], started: Any) -> dict[str, Any] | None:
    """The last tick at or before ``started`` (the oldest tick when none is, or no start is known)."""
    if not samples:
        return None
    if not isinstance(started, (int, float)):
        return samples[0]
    before = [s for s in samples if isinstance(s.get("t"), (int, float)) and s["t"] <= started]
    return before[-1] if before else samples[0]


def leak_in(samples: list[dict[str, Any]]) -> LeakTrend | None:
    """The leak detector's suspect at the last tick that had one (payload version 2)."""
    for s in reversed(samples):
        lk = s.get("leak")
        if isinstance(lk, dict):
            try:
                return LeakTrend(str(lk["source"]), str(lk.get("model", "")), str(lk.get("layer", "")),
                                 str(lk.get("device", "")), float(lk["slope_bytes_per_second"]),
                                 float(lk["growth_bytes"]), float(lk["window_seconds"]))
            except (KeyError, TypeError, ValueError):  # a damaged record's suspect: left out
                return None
    return None


def oom_figures(c: Contents, limit_bytes: int | None) -> OomFigures:
    samples = c.samples
    req = the_request(c)
    start = start_sample(samples, req.get("started_unix") if req else None)
    last = samples[-1] if samples else None
    static = resident(start) if start is not None else None
    rise = None
    if req is not None and start is not None and last is not None:
        h0, h1 = heap(start), heap(last)
        rise = h1 - h0 if h0 is not None and h1 is not None else None
    host = req is not None and req.get("device", "cpu") == "cpu" and req.get("unit", "tensor") in HOST_UNITS
    features = {k: v for k, v in ((req or {}).get("features") or {}).items() if isinstance(v, int)}
    out_now = outside(last) if last is not None else None
    out_then = outside(start) if start is not None else None
    notes = ["static_bytes: resident memory at the last tick before the forward in flight began",
             "request_rise_bytes: the C heap's growth from that tick to the last"] if req is not None else []
    return OomFigures(
        device="cpu", limit_bytes=limit_bytes, limit="cgroup" if limit_bytes is not None else None,
        static_bytes=static, features=features,
        predicted_peak_bytes=_num(req.get("predicted_peak_bytes")) if host and req is not None else None,
        max_safe_batch=_num(req.get("max_safe_batch")) if host and req is not None else None,
        request_rise_bytes=rise, outside_bytes=out_now,
        outside_baseline_bytes=out_then if out_now is not None else None,
        leak=leak_in(samples), unit=(req or {}).get("unit") if host else None, notes=tuple(notes))


def cause_of(c: Contents, reason: str, limit_bytes: int | None) -> Cause:
    """The cause of a post-mortem's end. Only an OOM kill has a memory cause: for the other
    reasons the figures are given and no cause is claimed."""
    figures = oom_figures(c, limit_bytes)
    if reason != OOM_KILL:
        return Cause(UNKNOWN, f"ended {reason}, with no out-of-memory evidence: no memory cause is claimed",
                     "see the evidence: a signal or an exit that was not the OOM killer's", figures)
    return classify(figures)


__all__ = ["cause_of", "oom_figures"]
