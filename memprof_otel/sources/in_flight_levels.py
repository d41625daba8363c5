"""The level each device's allocator was at when the forwards now in flight began.

A budget read while a forward runs holds that forward's own transient in the device's in-use
figure, and the answer about a request (the largest recent one, or the next) adds that request's
predicted peak on top: read mid-forward, the transient would count twice. On CPU
``process_hwm`` keeps the resident size at each marked forward's start; on a device whose
forwards are read in its allocator's units (CUDA: ``attribution/kernel_reading.py`` reads the
allocator at the root's start anyway) the allocated bytes at each start are kept here, so the
budget can count the level between forwards instead.

A start whose forward never ended (a thread abandoned it) is forgotten after ``STALE_S``; a
forked child starts with none (its parent's forwards are not its own).

Every instrumented forward, plain ones included, also counts its start and its end here
(``forward_event``): a budget read before a forward began or ended is not the level after it (the
forward may have kept hundreds of MiB the heap did not give back, or given back what it held), so
the budget reader's brief cache holds only while this count stands still.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Callable

from .process_hwm import STALE_S


class InFlightLevels:
    """Thread-safe. ``open`` at a forward's start, ``close`` at its end (any end: learnt, dropped
    or raised); ``excess`` is what a reading now holds above the lowest start still open."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._next = 0
        self._open: dict[int, tuple[str, int, float]] = {}  # token -> (device, level, when)

    def _same_process(self) -> None:
        if os.getpid() != self._pid:  # a forked child: the forwards in flight were its parent's
            self._pid = os.getpid()
            self._open.clear()

    def open(self, device: str, level: int) -> int:
        """A forward on ``device`` starts with its allocator at ``level`` bytes; the token closes it."""
        with self._lock:
            self._same_process()
            self._next += 1
            self._open[self._next] = (device, int(level), self._clock())
            return self._next

    def close(self, token: int) -> None:
        with self._lock:
            self._open.pop(token, None)

    def start(self, device: str) -> int | None:
        """The lowest level at which a forward on ``device`` still in flight began (None: none is)."""
        now = self._clock()
        with self._lock:
            self._same_process()
            for token, (_, _, at) in list(self._open.items()):
                if now - at > STALE_S:
                    del self._open[token]
            levels = [lv for d, lv, _ in self._open.values() if d == device]
        return min(levels) if levels else None

    def excess(self, device: str, level_now: int) -> int:
        """How far ``level_now`` lies above the level at which the forwards in flight on ``device``
        began (0 when none is): the part of the reading that is their own transient."""
        start = self.start(device)
        return max(0, int(level_now) - start) if start is not None else 0


_SHARED = InFlightLevels()
_events = itertools.count(1)
_epoch = 0


def forward_event() -> None:
    """A forward began or ended (any thread, any model; on its root hook). No lock: ``next()`` on
    a count is one C call, so every value stored is new, and a reader that compares ``epoch()``
    with a value it saw earlier sees any store since, in whatever order two threads made theirs."""
    global _epoch
    _epoch = next(_events)


def epoch() -> int:
    """The count of forward starts and ends so far in this process."""
    return _epoch


def shared() -> InFlightLevels:
    """The process's table: the budget reader asks the one the forwards write."""
    return _SHARED


__all__ = ["epoch", "forward_event", "InFlightLevels", "shared"]
