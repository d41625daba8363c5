"""A forward's figure in the units its memory limit counts, read at the root's start and end.

The per-layer figures are tensor bytes (the ledger, the allocator's allocated bytes). What ends a
process is counted otherwise: on CPU the kernel counts resident pages (the cgroup's limit, the
OOM killer), so the figure is the rise of the process's resident high-water mark
(``sources/process_hwm.py``); on CUDA the caching allocator fails when it cannot *reserve* another
segment, so the figure is the growth of reserved bytes (at least the allocated rise: a forward
served from cached segments still needs its blocks). The memory model learns these beside the
tensor figures and answers in them (``capacity/service.py``).

A CPU mark is process-wide: a reading another forward overlapped is dropped, as the adapters drop
readings of the device's shared counters. One call at the root's start and one at its end.

Each start is also the level between forwards that a budget read meanwhile should count: the CPU
mark keeps its resident size (``process_hwm``), a CUDA start its allocated bytes
(``sources/in_flight_levels.py``), until the root's end.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from ..capacity.memory_budget import CUDA_RESERVED, PROCESS_RESIDENT, TENSOR
from ..sources import in_flight_levels, process_hwm, registry


class KernelMark:
    __slots__ = ("unit", "mark", "source", "reserved_start", "overlapped", "token")

    def __init__(self, unit: str, mark: process_hwm.Mark | None, source: Any, reserved_start: int,
                 overlapped: bool, token: int | None = None) -> None:
        self.unit = unit
        self.mark = mark
        self.source = source
        self.reserved_start = reserved_start
        self.overlapped = overlapped
        self.token = token  # the CUDA start's entry in in_flight_levels, closed at the end


class KernelFigure(NamedTuple):
    """One forward in the limit's units: its peak above the start and what it kept; ``level``:
    the absolute peak it reached (CPU: the process's resident bytes; CUDA: reserved bytes)."""
    unit: str
    peak_increase: int
    retained: int
    level: int = 0


def begin(device: str, overlapped: bool, cuda: bool = True, level: int | None = None) -> KernelMark | None:
    """At the root's start. ``overlapped``: another forward is open now (its reading will be
    dropped). ``cuda`` False where the CUDA figures would not be torch's allocator's; ``level``:
    the allocator's allocated bytes at the start where the caller read them already (a traced
    CUDA forward, whose point is one read a forward): kept as the level between forwards, nothing
    learnt. None where nothing can be read (the tensor figure answers alone)."""
    if device == "cpu":
        mark = process_hwm.shared().begin()
        return KernelMark(PROCESS_RESIDENT, mark, None, 0, overlapped) if mark is not None else None
    if cuda and device.startswith("cuda"):
        src = registry.cuda_allocator(int(device.partition(":")[2] or 0))
        if src is None:
            return None
        try:
            r = src.reading()
        except Exception:  # an allocator that cannot be read: the tensor figure answers alone
            return None
        # the allocated level now is what a budget read before this forward's end should count
        token = in_flight_levels.shared().open(device, r.allocated)
        return KernelMark(CUDA_RESERVED, None, src, r.reserved, overlapped, token)
    if level is not None and device.startswith("cuda"):
        return KernelMark(TENSOR, None, None, 0, overlapped, in_flight_levels.shared().open(device, level))
    return None


def end(mark: KernelMark | None, alone: bool) -> KernelFigure | None:
    """At the root's end (``alone``: it ran alone and did not raise). None when the reading must
    not be learnt."""
    if mark is None:
        return None
    if mark.unit == PROCESS_RESIDENT:
        assert mark.mark is not None
        if not alone or mark.overlapped:
            process_hwm.shared().discard(mark.mark)
            return None
        rise = process_hwm.shared().end(mark.mark)
        return (KernelFigure(PROCESS_RESIDENT, rise.peak_increase, rise.retained, mark.mark.start_rss + rise.peak_increase)
                if rise is not None else None)
    if mark.token is not None:
        in_flight_levels.shared().close(mark.token)
    if mark.unit == TENSOR or not alone or mark.overlapped:  # TENSOR: a start level kept, nothing read
        return None
    # reserved bytes only shrink inside a forward on the allocator's free-and-retry path before an
    # OOM (a forward that raised is not learnt), so the level at the end is the forward's peak
    try:
        reserved = mark.source.reading().reserved
    except Exception:
        return None
    return KernelFigure(CUDA_RESERVED, max(0, reserved - mark.reserved_start), reserved - mark.reserved_start, reserved)


def unavailable_reason(device: str) -> str | None:
    """Why a forward on ``device`` has no figure in its limit's units (None: it has one)."""
    if device == "cpu":
        return process_hwm.shared().reason()
    if device.startswith("cuda"):
        return None
    return f"no kernel-side figure is read on {device}"


__all__ = ["CUDA_RESERVED", "KernelFigure", "KernelMark", "PROCESS_RESIDENT", "TENSOR", "begin", "end",
           "unavailable_reason"]
