"""A measuring window: the next forwards of one model attributed whatever the scheduler's budget,
their per-layer figures kept per input shape, for a baseline of a live service
(``POST /v1/baseline``, ``memprof-otel baseline save``).

Under the shipped defaults a service attributes a few forwards in a hundred, whichever the
scheduler picks, so the figures since start are maxima over a handful of forwards of whatever shapes
they had: two runs of one build compare different inputs. A window attributes every model forward
while it is open (as a deep capture does, without recording allocations) until ``forwards`` of them
are kept or its owner closes it, and keeps each one's figures under its shape (``baselines/shapes.py``).
It costs the service what an attributed forward costs, on every forward, while it is open: the
owner bounds it by a forward count and a time limit. That cost is counted in the overhead, not in
the sampling's budget: the sampling attributes afterwards as it did before.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping

from ..baselines.shapes import ShapeAccumulator, ShapeFigures, forward_layers
from .peaks import LayerCall


class MeasureWindow:
    """Thread-safe: forwards of several threads add to it."""

    def __init__(self, model: str, forwards: int) -> None:
        if isinstance(forwards, bool) or not isinstance(forwards, int) or not 1 <= forwards <= 10_000:
            raise ValueError(f"forwards must be an int in [1, 10000], got {forwards!r}")
        self.model = model
        self.forwards = forwards
        self.opened_s = time.monotonic()
        self.closed_s: float | None = None
        self.raised = 0     # forwards that raised: not kept
        self.dropped = 0    # forwards whose figures were dropped (another forward moved a shared counter)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._acc = ShapeAccumulator()

    @property
    def open(self) -> bool:
        return self.closed_s is None and not self._done.is_set()

    @property
    def kept(self) -> int:
        return self._acc.forwards

    def add(self, features: Mapping[str, int] | None, calls: Iterable[LayerCall], raised: bool) -> None:
        """One attributed model forward ended while the window was open."""
        with self._lock:
            if not self.open:
                return
            if raised:
                self.raised += 1
                return
            self._acc.add(features, forward_layers(calls))
            if self._acc.forwards >= self.forwards:
                self._done.set()

    def wait(self, timeout_s: float) -> bool:
        """Until ``forwards`` were kept (True) or ``timeout_s`` passed (False)."""
        return self._done.wait(max(0.0, timeout_s))

    def close(self) -> list[ShapeFigures]:
        """No more forwards (a waiter is woken); the shapes kept, most forwards first."""
        with self._lock:
            if self.closed_s is None:
                self.closed_s = time.monotonic()
            self._done.set()
            return self._acc.shapes()

    @property
    def complete(self) -> bool:
        return self.kept >= self.forwards

    @property
    def seconds(self) -> float:
        return (self.closed_s if self.closed_s is not None else time.monotonic()) - self.opened_s
