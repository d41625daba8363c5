"""The forwards open now in one domain of shared counters: did a forward run alone?

A forward read from a counter every thread moves (CUDA's allocator statistics, TensorFlow's or
JAX's figures of a device) holds only if no other forward ran meanwhile: none open at its start,
none opened while it ran, none open at its end. Each adapter keeps one ``OpenForwards`` for the
forwards that can move its counters. No lock: ``next()`` on a count is one C call (atomic under
the GIL), and each thread only writes its own key of the dict (a count: forwards of two models
nest on one thread). This runs on every forward's root hook.
"""
from __future__ import annotations

import itertools
import threading

_get_ident = threading.get_ident


class OpenForwards:
    def __init__(self) -> None:
        self._openings = itertools.count()
        self._threads: dict[int, int] = {}  # thread ident -> forwards it has open now

    def open(self) -> int:
        """Record a forward opening on this thread; returns its number, for ``ran_alone``."""
        ident = _get_ident()
        self._threads[ident] = self._threads.get(ident, 0) + 1
        return next(self._openings)

    def another_thread_open(self) -> bool:
        """After ``open()``: does another thread have a forward open now?"""
        return len(self._threads) > 1

    def close(self) -> None:
        """Record this thread's innermost forward as closed."""
        ident = _get_ident()
        left = self._threads.pop(ident, 1) - 1
        if left > 0:  # an outer forward (another model's) is still open on this thread
            self._threads[ident] = left

    def ran_alone(self, number: int) -> bool:
        """After this thread's ``close()``: did forward ``number`` open no other forward's way, i.e.
        none opened after it and none is open now (an outer one of this thread included)?"""
        return next(self._openings) - number <= 1 and not self._threads


__all__ = ["OpenForwards"]
