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

from ..sources.in_flight_levels import forward_event

_get_ident = threading.get_ident
_current_thread = threading.current_thread


class OpenForwards:
    def __init__(self) -> None:
        self._openings = itertools.count()
        # thread ident -> (the thread, the forwards it has open now). The thread is kept so that a
        # thread that ended with a forward open (a KeyboardInterrupt gets no always-call hook, a
        # worker abandoned mid-forward) is forgotten: otherwise its count stayed for the life of the
        # process and every later forward on these counters was dropped as overlapped (seen in the
        # test suite: one interrupted worker thread, then no CUDA figure in that process). Checked
        # only when another thread looks open, so the common single-thread path stays as cheap.
        self._threads: dict[int, tuple[threading.Thread, int]] = {}

    def open(self) -> int:
        """Record a forward opening on this thread; returns its number, for ``ran_alone``."""
        ident, me = _get_ident(), _current_thread()
        entry = self._threads.get(ident)
        # an entry of an ended thread whose ident this one reuses is not this thread's
        self._threads[ident] = (me, entry[1] + 1 if entry is not None and entry[0] is me else 1)
        forward_event()  # what this process holds may move from here: a budget read before is stale
        return next(self._openings)

    def another_thread_open(self) -> bool:
        """After ``open()``: does another thread have a forward open now?"""
        if len(self._threads) > 1:
            self._forget_ended()
        return len(self._threads) > 1

    def close(self) -> None:
        """Record this thread's innermost forward as closed."""
        forward_event()
        ident = _get_ident()
        entry = self._threads.pop(ident, None)
        if entry is not None and entry[1] > 1:  # an outer forward (another model's) is still open here
            self._threads[ident] = (entry[0], entry[1] - 1)

    def ran_alone(self, number: int) -> bool:
        """After this thread's ``close()``: did forward ``number`` open no other forward's way, i.e.
        none opened after it and none is open now (an outer one of this thread included)?"""
        if self._threads:
            self._forget_ended()
        return next(self._openings) - number <= 1 and not self._threads

    def _forget_ended(self) -> None:
        """Drop the entries of threads that ended with a forward open. Only an ended thread's entry
        is removed, and only while it is still that entry (a new thread reusing the ident writes its
        own): the check and the pop are not one step, which at worst lets one forward of a thread
        that started in between count as alone."""
        for ident, entry in list(self._threads.items()):
            if not entry[0].is_alive() and self._threads.get(ident) is entry:
                self._threads.pop(ident, None)


__all__ = ["OpenForwards"]
