"""The text report behind ``mp.report()``: peak RSS, when, during which operation, and the timeline.

Pure: samples and operation records in, a string out. No I/O, no threads, never raises on odd data.
"""
from __future__ import annotations

import math
import time
from typing import Iterable, NamedTuple, Sequence

from ..timeline import OperationRecord, Sample
from ..units import format_bytes

DEFAULT_TITLE = "MEMPROF-OTEL MEMORY REPORT"


class PeakInfo(NamedTuple):
    rss_bytes: int
    t: float                                   # unix time of the sample with the largest RSS
    operation: OperationRecord | None          # innermost operation open at ``t``


def _covers(op: OperationRecord, t: float) -> bool:
    return op.start <= t and (op.end is None or t <= op.end)


def operation_at(operations: Iterable[OperationRecord], t: float) -> OperationRecord | None:
    """The innermost record open at ``t``: an ``operation`` beats a ``phase``, then the one that
    started last (ties: the later id). ``start <= t <= end``; an open record covers everything after
    its start."""
    covering = [op for op in operations if _covers(op, t)]
    if not covering:
        return None
    return max(covering, key=lambda op: (op.kind == "operation", op.start, op.id))


def _rss(s: Sample) -> int:
    try:
        return s.rss
    except (TypeError, ValueError, OverflowError):  # a NaN/inf that slipped into a sample
        return 0


def find_peak(samples: Sequence[Sample], operations: Iterable[OperationRecord]) -> PeakInfo | None:
    """The sample with the largest RSS (the earliest on ties) and the operation it fell in;
    ``None`` without samples. Without a record covering the peak, the sample's own ``operation``
    name is matched against the records (the latest one started by then)."""
    if not samples:
        return None
    ops = list(operations)
    peak = max(samples, key=lambda s: (_rss(s), -s.t))
    op = operation_at(ops, peak.t)
    if op is None and peak.operation:
        named = [o for o in ops if o.name == peak.operation]
        before = [o for o in named if o.start <= peak.t]
        pick = before or named
        op = max(pick, key=lambda o: (o.start, o.id)) if pick else None
    return PeakInfo(_rss(peak), peak.t, op)


def signed_bytes(n: float) -> str:
    """``+1.5 GiB`` / ``-512.0 MiB`` / ``+0 B``."""
    return format_bytes(n) if n < 0 else "+" + format_bytes(n)


def _clock(t: float) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return "??:??:??"


def ordered_operations(operations: Iterable[OperationRecord]) -> list[tuple[int, OperationRecord]]:
    """``(depth, record)`` in display order: top-level records (and orphans whose parent is not in
    the list) by start, each followed by its children, recursively, also by start."""
    ops = sorted(operations, key=lambda o: (o.start, o.id))
    ids = {o.id for o in ops}
    children: dict[int, list[OperationRecord]] = {}
    roots: list[OperationRecord] = []
    for o in ops:
        if o.parent_id is not None and o.parent_id in ids and o.parent_id != o.id:
            children.setdefault(o.parent_id, []).append(o)
        else:
            roots.append(o)
    out: list[tuple[int, OperationRecord]] = []
    seen: set[int] = set()

    def walk(top: OperationRecord, depth: int) -> None:
        # depth first with a stack of our own, not recursion: a chain of thousands of nested
        # operations (a leaked one makes every later one its child) must not hit Python's limit
        stack = [(top, depth)]
        while stack:
            o, d = stack.pop()
            if id(o) in seen:  # a parent cycle in hand-edited data
                continue
            seen.add(id(o))
            out.append((d, o))
            stack.extend((c, d + 1) for c in reversed(children.get(o.id, ())))

    for r in roots:
        walk(r, 0)
    for o in ops:  # records only reachable through a cycle: show them at the top level
        if id(o) not in seen:
            walk(o, 0)
    return out


def _operation_line(label: str, depth: int, op: OperationRecord, offset: float,
                    is_peak: bool, rss_now: int | None) -> str:
    if op.open:
        so_far = f" [{signed_bytes(rss_now - op.rss_start)} so far]" if rss_now is not None else ""
        tail = f"(running){so_far}"
    else:
        tail = f"({op.duration:.1f}s) [{signed_bytes(op.delta_bytes)}]"
    flags = (" [OOM]" if op.oom else "") + (f" [raised {op.error}]" if op.error else "")
    return (f"{'    ' * depth}{label:>5}.{offset:>7.1f}s - {op.name} {tail}{flags}"
            f"{' <- Peak' if is_peak else ''}")


def _device_peaks(samples: Sequence[Sample]) -> list[tuple[str, int, float]]:
    best: dict[str, tuple[int, float]] = {}
    for s in samples:
        for dev, figures in s.allocators.items():
            v = figures.get("allocated_bytes")
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            if dev not in best or v > best[dev][0]:
                best[dev] = (int(v), s.t)
    return [(dev, v, t) for dev, (v, t) in sorted(best.items())]


def format_report(samples: Sequence[Sample], operations: Iterable[OperationRecord], *,
                  title: str = DEFAULT_TITLE, now: float | None = None) -> str:
    """The report people know from phase profilers. ``now`` (unix time) ends the Duration window;
    by default the last sample or the last operation end, whichever is later."""
    ops = list(operations)
    if not samples:
        return f"{title}: no samples yet (start monitoring, run some work, then ask again)"
    ordered_samples = sorted(samples, key=lambda s: s.t)
    first, last = ordered_samples[0], ordered_samples[-1]
    peak = find_peak(ordered_samples, ops)
    assert peak is not None
    start0 = min([first.t, *(o.start for o in ops)])
    end0 = now if now is not None else max([last.t, *(o.end for o in ops if o.end is not None)])

    if peak.operation is not None:
        during = peak.operation.name
    else:
        during = next((s.operation for s in ordered_samples if s.t == peak.t and s.operation), None)
        during = during or "(no operation)"

    lines = [title, "=" * max(60, len(title)),
             "Peak Memory Usage:",
             f"   • RSS (Physical): {format_bytes(peak.rss_bytes)} at {_clock(peak.t)}"]
    for dev, v, t in _device_peaks(ordered_samples):
        lines.append(f"   • {dev} allocated: {format_bytes(v)} at {_clock(t)}")
    lines += [f"   • Peak during:    {during}",
              "",
              "Memory Statistics:",
              f"   • Current RSS:    {format_bytes(_rss(last))} "
              f"(Delta: {signed_bytes(_rss(last) - _rss(first))})",
              f"   • Duration:       {max(0.0, end0 - start0):.1f} seconds",
              f"   • Operations:     {len(ops)}"]
    if not ops:
        lines += ["", "Operations Timeline: none recorded (use mp.operation() or mp.mark_operation())"]
        return "\n".join(lines)

    lines += ["", "Operations Timeline:"]
    labels: dict[int, str] = {}          # record id -> "2.1"
    counters: dict[str, int] = {}         # parent label ("" at the top) -> children numbered so far
    for depth, op in ordered_operations(ops):
        parent = labels.get(op.parent_id, "") if depth and op.parent_id is not None else ""
        counters[parent] = counters.get(parent, 0) + 1
        label = f"{parent}.{counters[parent]}" if parent else str(counters[parent])
        labels[op.id] = label
        is_peak = peak.operation is op
        rss_now = _rss(last) if last.t >= op.start else None
        lines.append(_operation_line(label, depth, op, op.start - start0, is_peak, rss_now))
    return "\n".join(lines)
