"""Per-layer peak accounting over a counter that offers "level now" and "peak since mark".

Window splitting: a device counter has one peak register, so nested modules share it. When a
child enters, the peak seen so far is folded into the parent's frame and the register is reset for
the child. When the child exits, the child's peak is folded into the parent and the register is
reset again, so the parent's next window starts at the current level. No frame ever loses a peak
that happened while it was on the stack, and a transient inside a child counts for the child and
every ancestor, never for a sibling. The caller resets the register after ``enter`` and ``exit``.
"""
from __future__ import annotations

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


# A frame is a list, not an object: one is made per module call of an attributed forward, and a
# list is built and indexed several times faster than a dataclass. Fields, by index:
_PATH, _KEY, _ENTRY, _PEAK, _ALLOCS, _FREES, _START, _RPEAK = range(8)
_new_call = tuple.__new__  # LayerCall(...) through its Python __new__ costs 3x more


class PeakTracker:
    """One per thread of execution; not thread-safe by design (each thread owns its own)."""

    def __init__(self) -> None:
        self._stack: list[list] = []

    @property
    def depth(self) -> int:
        return len(self._stack)

    def innermost(self) -> str | None:
        """The path of the innermost open frame (None when none is open)."""
        stack = self._stack
        return stack[-1][_PATH] if stack else None

    def enter(self, path: str, key: int, r: Reading, now_s: float) -> None:
        allocated, reserved, peak, allocations, frees, _frag, reserved_peak = r
        stack = self._stack
        rp = reserved_peak if reserved_peak > reserved else reserved
        if stack:
            parent = stack[-1]
            p = peak if peak > allocated else allocated
            if p > parent[_PEAK]:
                parent[_PEAK] = p
            if rp > parent[_RPEAK]:
                parent[_RPEAK] = rp
        stack.append([path, key, allocated, allocated, allocations, frees, now_s, rp])

    def exit(self, key: int, r: Reading, now_s: float, raised: bool = False) -> list[LayerCall]:
        """Close the frame entered with ``key``.

        Returns the calls closed, innermost first: normally one; more when inner frames were never
        exited (a hook that could not run); none when ``key`` is not on the stack (an exit we never
        saw enter, e.g. hooks installed mid-forward), which leaves the stack untouched.
        """
        stack = self._stack
        if not stack:
            return []
        if stack[-1][_KEY] != key and not any(f[_KEY] == key for f in stack):
            return []
        allocated, reserved, peak, allocations, frees, frag, reserved_peak = r
        level_peak = peak if peak > allocated else allocated
        rp = reserved_peak if reserved_peak > reserved else reserved
        closed = []
        while True:
            f = stack.pop()
            fpeak = f[_PEAK] if f[_PEAK] > level_peak else level_peak
            frp = f[_RPEAK] if f[_RPEAK] > rp else rp
            dur = now_s - f[_START]
            fkey = f[_KEY]
            closed.append(_new_call(LayerCall, (f[_PATH], f[_ENTRY], fpeak, allocated, allocations - f[_ALLOCS],
                                                 frees - f[_FREES], dur if dur > 0.0 else 0.0, frag,
                                                 raised or fkey != key, frp)))
            if stack:
                parent = stack[-1]
                if fpeak > parent[_PEAK]:
                    parent[_PEAK] = fpeak
                if frp > parent[_RPEAK]:
                    parent[_RPEAK] = frp
            if fkey == key:
                return closed

    def clear(self) -> None:
        self._stack.clear()
