"""What a forked child renews, in two ordered stages (``gunicorn --preload``, ``multiprocessing``).

A child inherits its parent's locks (maybe held by a thread it does not have), its counters (the
parent's events, which each child would count again) and none of its threads. Each object that
keeps such state adds its renewal to a stage; the stage calls them in the child, in the order they
were added, from one at-fork hook registered at the first ``add`` (importing registers nothing).

At-fork hooks run in the order they were registered, and the sampler registers its own at its
first start, re-arming its thread in the child (``sampler.py``). ``STATE`` is first added to before
that (the composition root and its counters, when built), so the child has fresh locks and counters
before the sampler thread can touch them; ``SERVICES`` is first added to after it (exporters and
the endpoint, which find the sampler running). The methods are held weakly, as OpenTelemetry's SDK
holds its own (``register_at_fork`` with a ``WeakMethod``): an object built by a test and dropped is
not kept alive, and is not renewed.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Callable

from .._log import rate_limited


class ForkStage:
    """Bound methods called in a forked child, in the order they were added."""

    def __init__(self) -> None:
        self._renewals: list[weakref.WeakMethod[Callable[[], None]]] = []
        self._lock = threading.Lock()
        self._hooked = False

    def add(self, renew: Callable[[], None]) -> None:
        """Call ``renew`` (a bound method) in every child forked from now on."""
        with self._lock:
            self._renewals = [r for r in self._renewals if r() is not None]
            self._renewals.append(weakref.WeakMethod(renew))  # type: ignore[arg-type]
            if not self._hooked and hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=self._in_child)
                self._hooked = True

    def _in_child(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held at the fork
        for ref in list(self._renewals):
            renew = ref()
            if renew is None:
                continue
            try:
                renew()
            except Exception as e:  # the child must start, whatever happens to telemetry
                rate_limited.warning("fork", "memprof_otel: renewing monitoring after fork failed: %r", e)


STATE = ForkStage()     # locks and counters: before the sampler's thread re-arms
SERVICES = ForkStage()  # exporters and the endpoint: after it


__all__ = ["SERVICES", "STATE", "ForkStage"]
