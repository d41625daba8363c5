"""The one small interface every memory source implements.

A source answers five questions about one device or the process: how much is allocated, how much
is reserved, the peak since the last reset, reset that peak, and a full ``stats()`` dict for the
sampler. Hot-path callers (per-layer hooks) use ``reading()``, which answers the first three at
once so a source with an expensive backend (CUDA's stats dict) is read once per hook, not thrice.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable


class Reading(NamedTuple):
    """One hot-path reading. Counts are cumulative (``allocations`` only grows)."""
    allocated: int
    reserved: int
    peak: int            # peak allocated since the last reset_peak()
    allocations: int     # cumulative number of allocations (0 when the source cannot count)
    frees: int           # cumulative number of frees
    fragmentation: float | None  # unusable gaps / reserved, 0..1; None when not measured
    reserved_peak: int = 0  # peak reserved since the last reset_peak() (0 when not tracked)


@runtime_checkable
class MemorySource(Protocol):
    """``name`` is the ``device``/``source`` label: ``cpu``, ``cuda:0``, ``process``, ``nvml``."""
    name: str

    def allocated(self) -> int: ...
    def reserved(self) -> int: ...
    def peak_since_reset(self) -> int: ...
    def reset_peak(self) -> None: ...
    def stats(self) -> dict[str, float]: ...
    def reading(self) -> Reading: ...


@runtime_checkable
class HotCounter(Protocol):
    """What an attributed forward reads at every layer boundary: ``read_and_reset`` gives the level
    and the peak since the last call and starts the next peak window there, in one step (a CPU
    tensor ledger, a CUDA allocator source, a framework's own allocator statistics)."""

    def read_and_reset(self) -> Reading: ...
    def reset_peak(self) -> None: ...


def ratio(part: float, whole: float) -> float:
    """part / whole clamped to 0..1; 0.0 when whole is 0 (an empty allocator is not fragmented)."""
    if whole <= 0:
        return 0.0
    return min(1.0, max(0.0, part / whole))
