"""Boundary readings from allocator trace events: what a per-boundary stats read would have said.

A traced forward tags its thread with ``<tag><i>`` at its i-th module boundary (root entry is 0),
so every allocator event it causes between boundary i and i+1 carries ``<tag><i>``. Replaying the
events in trace order rebuilds, for each boundary, a ``Reading`` shaped like the per-boundary
method's: the level of requested bytes then, and the peak since the previous boundary
(the peak register is reset at each boundary, so it restarts at the level there). The
``PeakTracker`` then runs on these readings exactly as on live ones.

Which events move which figure (``c10/cuda/CUDACachingAllocator.cpp``): the trace records each
allocation's *requested* size (``orig_size``) at ``alloc`` and the same at ``free_requested`` (a block
whose stream work is still pending is freed for the stats there, and only returned to the pool at
``free_completed``), so the level rebuilt here is torch's ``requested_bytes``, not
``allocated_bytes`` (block sizes: 512 B rounding and large blocks' unsplit remainders, which no event
carries); ``reserved_bytes`` moves at ``segment_alloc``/``segment_free`` and, with expandable
segments, ``segment_map``/``segment_unmap``. Events of other threads or other forwards carry other tags and
are skipped: each forward sees its own thread's allocations only. Pure: no torch.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..sources.base import Reading

__all__ = ["boundary_readings"]

_RESERVED = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
_new_reading = tuple.__new__


def boundary_readings(events: Iterable[Mapping[str, Any]], tag: str, boundaries: int, base_allocated: int,
                      base_reserved: int) -> list[Reading]:
    """One reading per boundary (``boundaries`` of them), levels offset by the allocator's
    ``base_allocated``/``base_reserved`` at the forward's start. Fragmentation is not known from
    events: None (absent), never a made-up value.

    Written for speed: a decode step of GPT-2 brings ~800 events, and this runs at the end of every
    traced forward. Consecutive events mostly share one boundary string, so its index is parsed
    once per run of equal strings, not once per event."""
    if boundaries <= 0:
        return []
    n = len(tag)
    level = reserved = allocs = frees = 0
    peak = rpeak = 0  # the window's maxima, relative to the base
    out: list[Reading] = [_new_reading(Reading, (base_allocated, base_reserved, base_allocated, 0, 0, None,
                                                 base_reserved))]
    append = out.append
    last_md: Any = None
    window = -1
    for e in events:
        md = e.get("user_metadata")
        if md != last_md:
            last_md = md
            window = -1
            if md and md.startswith(tag):
                try:
                    window = int(md[n:])
                except ValueError:
                    window = -1
                if window >= boundaries:
                    window = -1  # after the last boundary (the forward's own teardown)
        if window < 0:
            continue  # another thread's or another forward's event, or none of ours
        while len(out) <= window:  # close the windows up to this one (some had no event of ours)
            append(_new_reading(Reading, (base_allocated + level, base_reserved + reserved, base_allocated + peak,
                                          allocs, frees, None, base_reserved + rpeak)))
            peak, rpeak = level, reserved
        action = e.get("action")
        if action == "alloc":
            level += e["size"]
            allocs += 1
            if level > peak:
                peak = level
        elif action == "free_requested":
            level -= e["size"]
            frees += 1
        else:
            step = _RESERVED.get(action)
            if step is not None:
                reserved += step * e["size"]
                if reserved > rpeak:
                    rpeak = reserved
    while len(out) < boundaries:
        append(_new_reading(Reading, (base_allocated + level, base_reserved + reserved, base_allocated + peak,
                                      allocs, frees, None, base_reserved + rpeak)))
        peak, rpeak = level, reserved
    return out
