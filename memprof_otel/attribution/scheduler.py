"""Which forwards get exact per-layer attribution: an adaptive overhead budget.

Attribution (module hooks on every layer and the tensor ledger on every op) multiplies the cost
of a forward; the root-level hook alone costs a few microseconds. The scheduler attributes a forward
only when what attribution has cost so far stays within ``budget`` of the time spent in forwards,
and at most every ``every_n`` forwards. The cost of an attributed forward is estimated as its
duration minus the recent duration of plain forwards (an EMA), and never less than what our hooks
timed themselves; with no plain forward seen yet, the whole duration is charged.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerState:
    forwards: int
    attributed: int
    forward_seconds: float
    attribution_seconds: float
    plain_forward_ema_s: float | None
    # the cost charged for the first attributed forward: always attributed and, with no plain
    # forward seen yet, charged whole; a one-off that a steady-state figure leaves out
    first_attributed_s: float = 0.0
    first_forward_s: float = 0.0  # that forward's plain-time share (what it adds to forward_seconds)


class AttributionScheduler:
    _EMA_ALPHA = 0.1

    def __init__(self, every_n: int, budget: float, enabled: bool = True) -> None:
        self.every_n = max(1, every_n)
        self.budget = budget
        self.enabled = enabled
        self._lock = threading.Lock()
        self._forwards = 0
        self._attributed = 0
        self._since_last = every_n  # so the first forward may be attributed
        self._forward_s = 0.0       # time of forwards as they would run plain
        self._spent_s = 0.0         # estimated cost of attribution (and root hooks)
        self._plain_ema: float | None = None
        self._first_cost_s: float | None = None
        self._first_plain_s = 0.0

    def should_attribute(self) -> bool:
        if not self.enabled:
            return False
        with self._lock:
            if self._since_last < self.every_n:
                return False
            if self.budget >= 1.0:
                return True
            return self._spent_s <= self.budget * self._forward_s

    def record(self, duration_s: float, attributed: bool, self_timed_s: float) -> float:
        """Account one finished forward; returns the attribution cost charged for it."""
        with self._lock:
            self._forwards += 1
            if attributed:
                self._attributed += 1
                self._since_last = 1
                base = self._plain_ema
                cost = duration_s if base is None else max(self_timed_s, duration_s - base)
                cost = min(cost, duration_s)
            else:
                self._since_last += 1
                cost = self_timed_s
                plain = max(0.0, duration_s - self_timed_s)
                self._plain_ema = plain if self._plain_ema is None else (
                    self._plain_ema + self._EMA_ALPHA * (plain - self._plain_ema))
            self._spent_s += cost
            self._forward_s += max(0.0, duration_s - cost)
            if self._first_cost_s is None:
                self._first_cost_s = cost
                self._first_plain_s = max(0.0, duration_s - cost)
            return cost

    def state(self) -> SchedulerState:
        with self._lock:
            return SchedulerState(self._forwards, self._attributed, self._forward_s, self._spent_s,
                                  self._plain_ema, self._first_cost_s or 0.0, self._first_plain_s)
