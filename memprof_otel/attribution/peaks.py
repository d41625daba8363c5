"""Per-layer peak accounting over a counter that offers "level now" and "peak since mark".

Window splitting: a device counter has one peak register, so nested modules share it. When a
child enters, the peak seen so far is folded into the parent's frame and the register is reset for
the child. When the child exits, the child's peak is folded into the parent and the register is
reset again, so the parent's next window starts at the current level. No frame ever loses a peak
that happened while it was on the stack, and a transient inside a child counts for the child and
every ancestor, never for a sibling. The caller resets the register after ``enter`` and ``exit``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..sources.base import Reading


class LayerCall(NamedTuple):
    """One completed call of one layer."""
    path: str
    entry_level: int
    peak_level: int       # highest level reached during the call (children included)
    exit_level: int
    allocations: int
    frees: int
    duration_s: float
    fragmentation: float | None  # at exit; None where the counter cannot measure it
    raised: bool
    reserved_peak: int

    @property
    def peak_increase(self) -> int:
        return self.peak_level - self.entry_level

    @property
    def retained(self) -> int:
        return self.exit_level - self.entry_level


@dataclass
class _Frame:
    path: str
    key: int            # identity of what was entered (module id); exits must match it
    entry_level: int
    peak: int
    allocations: int
    frees: int
    start_s: float
    reserved_peak: int


class PeakTracker:
    """One per thread of execution; not thread-safe by design (each thread owns its own)."""

    def __init__(self) -> None:
        self._stack: list[_Frame] = []

    @property
    def depth(self) -> int:
        return len(self._stack)

    def enter(self, path: str, key: int, r: Reading, now_s: float) -> None:
        if self._stack:
            parent = self._stack[-1]
            parent.peak = max(parent.peak, r.peak, r.allocated)
            parent.reserved_peak = max(parent.reserved_peak, max(r.reserved_peak, r.reserved))
        self._stack.append(_Frame(path, key, r.allocated, r.allocated, r.allocations, r.frees, now_s, max(r.reserved_peak, r.reserved)))

    def exit(self, key: int, r: Reading, now_s: float, raised: bool = False) -> list[LayerCall]:
        """Close the frame entered with ``key``.

        Returns the calls closed, innermost first: normally one; more when inner frames were never
        exited (a hook that could not run); none when ``key`` is not on the stack (an exit we never
        saw enter, e.g. hooks installed mid-forward), which leaves the stack untouched.
        """
        if not any(f.key == key for f in self._stack):
            return []
        closed = []
        while True:
            f = self._stack.pop()
            peak = max(f.peak, r.peak, r.allocated)
            reserved_peak = max(f.reserved_peak, max(r.reserved_peak, r.reserved))
            closed.append(LayerCall(f.path, f.entry_level, peak, r.allocated, r.allocations - f.allocations,
                                    r.frees - f.frees, max(0.0, now_s - f.start_s), r.fragmentation,
                                    raised or f.key != key, reserved_peak))
            if self._stack:
                parent = self._stack[-1]
                parent.peak = max(parent.peak, peak)
                parent.reserved_peak = max(parent.reserved_peak, reserved_peak)
            if f.key == key:
                return closed

    def clear(self) -> None:
        self._stack.clear()
