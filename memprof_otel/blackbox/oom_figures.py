"""What a dead process's black box says about the cause of its end: the figures of
``oom/cause.py``, read from the decoded file alone (pure). (An OOM raised in a live process gets the
same figures from its live state: ``telemetry/oom_figures.py``.) The next process has none of the dead
one's live state, so every figure comes from what it wrote: the limit and its ticks (resident
memory, the C heap's in-use bytes, the leak detector's suspect), and beside the forward in flight
its shape, its predicted peak and its largest safe batch (the suspect and the prediction are written
from payload version 2 on; an older file has neither).

The kernel kills for the cgroup's limit, which counts the process's memory on the host: the
figures are the host's. What was held is the level between forwards: the resident size read when
the forward in flight began with no other in flight (payload version 3), else the resident memory
at the last tick before it began that fell between forwards (a tick inside the previous forward
holds that forward's transient: requests back to back would show the room as far smaller than it
was). Where neither is known, it is not given (a note says why), never a tick inside a forward.
That level is then put in the limit's own terms: the cgroup counts its working set, not this
process's resident size (it adds the page cache it holds and its other processes; it leaves out
library pages another cgroup loaded first, which are resident here but charged there: 100 MB of
torch's libraries on a host where they were cached already), so the difference of the two at the
last tick before the request is added to it. The request's own rise is the C
heap's growth since that tick (tensors on CPU come from that heap), or the resident growth since
its start where no tick fell between forwards; memory outside the allocator is resident memory
outside the heap. A prediction made for a GPU forward is in the GPU's units and is left out.
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


def _at_or_before(samples: list[dict[str, Any]], started: Any) -> list[dict[str, Any]]:
    """The ticks at or before ``started``, in order ([] when no start is known)."""
    if not isinstance(started, (int, float)):
        return []
    return [s for s in samples if isinstance(s.get("t"), (int, float)) and s["t"] <= started]


def _before_start(samples: list[dict[str, Any]], started: Any) -> list[dict[str, Any]]:
    """The ticks at or before ``started``, else the oldest tick alone (none is, or no start is known)."""
    return _at_or_before(samples, started) or samples[:1]


def start_sample(samples: list[dict[str, Any]], started: Any) -> dict[str, Any] | None:
    """The last tick at or before ``started`` (the oldest tick when none is, or no start is known)."""
    before = _before_start(samples, started)
    return before[-1] if before else None


def between_sample(samples: list[dict[str, Any]], started: Any) -> dict[str, Any] | None:
    """The last tick at or before ``started`` that fell between forwards (``busy`` 0). A record
    from before ticks said so (no ``busy``) has its last tick before the start taken as before;
    None when every tick before the start fell inside a forward."""
    first = start_sample(samples, started)
    if first is None or "busy" not in first:
        return first
    if not isinstance(started, (int, float)):
        return next((s for s in samples if s.get("busy") == 0), None)
    idle = [s for s in _at_or_before(samples, started) if s.get("busy") == 0]
    return idle[-1] if idle else None


def charge_gap(s: Mapping[str, Any] | None) -> int | None:
    """The cgroup's working set less this process's resident size at tick ``s`` (may be negative:
    pages resident here but charged to another cgroup); None where the tick has not both."""
    if s is None:
        return None
    ws, rss = _num((s.get("container") or {}).get("memory_working_set_bytes")), resident(s)
    return ws - rss if ws is not None and rss is not None else None


# how many of the last ticks before a forward's start the charge gap is the median of
GAP_TICKS = 15


def charge_gap_before(samples: list[dict[str, Any]], started: Any) -> int | None:
    """The charge gap when the forward began: the median of ``charge_gap`` over the last
    ``GAP_TICKS`` ticks at or before ``started``. A tick's two figures come from two sources read
    on two threads at once, so a tick that fell in a forward allocating fast pairs a resident size
    and a working set some milliseconds apart: its gap is off by what was allocated between them
    (seen: 62 MiB, one tick in 30, in back-to-back requests, where no tick falls between forwards).
    What the gap measures (pages charged elsewhere) moves slowly, so the median drops such a tick."""
    gaps = sorted(g for s in _before_start(samples, started)[-GAP_TICKS:] if (g := charge_gap(s)) is not None)
    return gaps[len(gaps) // 2] if gaps else None


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
    started = req.get("started_unix") if req else None
    start = between_sample(samples, started)
    last = samples[-1] if samples else None
    # the level read at a forward's start with none other in flight: the request's, else the
    # earliest forward's still in flight (what was held before any of them began)
    levels = [(f.get("started_unix") or 0.0, v) for f in c.flight if (v := _num(f.get("start_resident_bytes"))) is not None]
    own = _num(req.get("start_resident_bytes")) if req is not None else None
    level = own if own is not None else (min(levels)[1] if levels else None)
    static = level if level is not None else (resident(start) if start is not None else None)
    gap = charge_gap_before(samples, started) if limit_bytes is not None else None
    if static is not None and gap is not None:
        static = max(0, static + gap)
    rise = None
    notes: list[str] = []
    if req is not None and start is not None and last is not None:
        h0, h1 = heap(start), heap(last)
        rise = h1 - h0 if h0 is not None and h1 is not None else None
        notes.append("request_rise_bytes: the C heap's growth from the last tick between forwards to the last tick")
    elif req is not None and level is not None and last is not None and resident(last) is not None:
        rise = resident(last) - level  # type: ignore[operator]
        notes.append("request_rise_bytes: the resident growth from the forward's start to the last tick")
    if req is not None:
        notes.insert(0, "static_bytes: resident memory when the forward in flight began, no other forward in flight"
                     if level is not None else
                     "static_bytes: resident memory at the last tick between forwards before the forward in flight began"
                     if static is not None else
                     "static_bytes: not known: no tick between forwards in the window and no level read at the start")
        if static is not None and gap is not None:
            notes.insert(1, "static_bytes: in the cgroup's terms: plus its working set less the resident size over the "
                         "last ticks before the forward began (their median)")
    host = req is not None and req.get("device", "cpu") == "cpu" and req.get("unit", "tensor") in HOST_UNITS
    features = {k: v for k, v in ((req or {}).get("features") or {}).items() if isinstance(v, int)}
    out_now = outside(last) if last is not None else None
    out_then = outside(start) if start is not None else None
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
