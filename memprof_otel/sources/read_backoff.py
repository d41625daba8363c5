"""How often an expensive read may run: at most every ``min_interval_s``, and less often as it gets
dearer, so that its measured cost stays under ``max_overhead_ratio`` of wall time.

The sources whose read walks a structure that grows (glibc's ``mallinfo2`` walks every free chunk,
CPython's arena statistics every pool) time each real read and keep a moving average of its cost;
the wait between reads is ``max(min_interval_s, cost / max_overhead_ratio)``, measured from the end
of the last read so that ``cost / (cost + wait)`` stays under the ratio.

Not locked: each source holds its own lock around these calls, the same lock that guards the
figures the read produced, so the two never disagree.
"""
from __future__ import annotations

from typing import Callable, TypeVar

_EMA_ALPHA = 0.3  # weight of the newest cost: follows a heap that fragments within a few reads

T = TypeVar("T")


class ReadBackoff:
    """The cost history of one expensive read and the wait it implies; ``clock`` is injectable."""

    def __init__(self, *, min_interval_s: float, max_overhead_ratio: float,
                 clock: Callable[[], float]) -> None:
        if not 0 < max_overhead_ratio <= 1:
            raise ValueError(f"max_overhead_ratio must be in (0, 1]: {max_overhead_ratio!r}")
        self._base_interval = min_interval_s
        self._max_ratio = max_overhead_ratio
        self._clock = clock
        self._cost_ema = self._last_cost = self._last_end = 0.0
        self._reads = 0

    @property
    def min_interval_s(self) -> float:
        """Current wait between real reads: the base, or longer when reads have been dear."""
        return max(self._base_interval, self._cost_ema / self._max_ratio)

    @property
    def cost_ema_s(self) -> float:
        """Moving average of the measured costs (the first read's cost after one read)."""
        return self._cost_ema

    @property
    def last_cost_s(self) -> float:
        """Seconds the last real read took."""
        return self._last_cost

    @property
    def reads(self) -> int:
        """Real reads recorded."""
        return self._reads

    def age_s(self) -> float:
        """Seconds since the last real read ended (or since ``hold_off``)."""
        return self._clock() - self._last_end

    def too_soon(self) -> bool:
        """Whether the wait since the last read is shorter than ``min_interval_s``."""
        return self.age_s() < self.min_interval_s

    def too_dear(self, max_cost_s: float | None) -> bool:
        """Whether the expected cost (the moving average) exceeds ``max_cost_s`` (None: no bound)."""
        return max_cost_s is not None and self._cost_ema > max_cost_s

    def hold_off(self) -> None:
        """Restart the wait now, before a read: a caller asking while it runs finds it too soon."""
        self._last_end = self._clock()

    def timed(self, read: Callable[[], T]) -> tuple[T, float, float]:
        """``read()`` with the clock before and after it: (result, start, end). Records nothing, so
        that the caller can record under its lock, and a read that raises leaves no trace."""
        start = self._clock()
        result = read()
        end = self._clock()
        return result, start, end

    def record(self, start: float, end: float) -> None:
        """One real read from ``start`` to ``end`` (clock times): its cost joins the average."""
        cost = self._last_cost = max(0.0, end - start)
        self._cost_ema = cost if self._reads == 0 else \
            _EMA_ALPHA * cost + (1 - _EMA_ALPHA) * self._cost_ema
        self._last_end = end
        self._reads += 1


__all__ = ["ReadBackoff"]
