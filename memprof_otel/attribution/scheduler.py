"""Which forwards get exact per-layer attribution: an adaptive overhead budget.

Attribution (module hooks on every layer and the tensor ledger on every op) multiplies the cost
of a forward; the root-level hook alone costs a few microseconds. The scheduler attributes a forward
only when what attribution has cost so far stays within ``budget`` of the time spent in forwards,
and at most every ``every_n`` forwards. The cost of an attributed forward is estimated as its
duration minus the recent duration of plain forwards (an EMA), and never less than what our hooks
timed themselves; with no plain forward seen yet, the whole duration is charged.

A forward of a shape the memory model has not measured yet may also be attributed beyond the
budget (``may_learn``, ``claim``): the capacity answers need a few distinct shapes, and at the
default 0.2 % the random picks found three distinct shapes in 608 forwards of 16 cycling shapes (two
minutes), so a gate stayed without an answer. The first ``LEARN_FIRST`` such forwards of each kind
(prompts, decode steps) of a process are always attributed; after them, only while attribution has
cost at most ``learning_budget`` of the forward time. Either way the cost is charged to the same
account as the budget's own picks, so the random picks wait until the budget has paid it back: the
long-run cost stays at ``budget`` where the traffic repeats its shapes, and at most
``learning_budget`` where it keeps bringing new ones.
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
    learned: int = 0  # forwards attributed because their shape was new to the memory model


class AttributionScheduler:
    _EMA_ALPHA = 0.1
    FIRST_COST_CAP = 3.0
    LEARN_FIRST = 16  # forwards of new shapes attributed whatever the budget, once per process
    LEARN_WAIT_MAX = 64  # forwards between two looks for a new shape, at most
    LEARN_WAIT_DENIED = 4  # the same after new shapes the learning budget had no room for

    def __init__(self, every_n: int, budget: float, enabled: bool = True, learning_budget: float = 0.0) -> None:
        self.every_n = max(1, every_n)
        self.budget = budget
        self.enabled = enabled
        self.learning_budget = learning_budget
        self._learned: dict[str, int] = {}  # kind of shape -> forwards attributed through claim
        self._learn_gap = 0  # forwards the last back-off waited (doubled by the next one, 0 after a claim)
        self._learn_wait = 0  # forwards still to wait before the next look at a shape
        self._lock = threading.Lock()
        self._forwards = 0
        self._attributed = 0
        self._since_last = every_n  # so the first forward may be attributed
        self._forward_s = 0.0       # time of forwards as they would run plain
        self._spent_s = 0.0         # estimated cost of attribution (and root hooks)
        # the part of it the budget governs: attributed forwards. The root hooks run on every
        # forward whatever the scheduler decides (a few microseconds); charged to the budget they
        # alone used it up on models whose forwards take a few milliseconds, and attribution (and
        # all that learns from it) stopped after the first forward
        self._attr_spent_s = 0.0
        self._plain_ema: float | None = None
        self._first_cost_s: float | None = None
        self._first_plain_s = 0.0
        self._first_attributed_s: float | None = None  # set while the first forward's charge is provisional
        self._first_self_timed_s = 0.0

    def should_attribute(self) -> bool:
        if not self.enabled:
            return False
        with self._lock:
            if self._since_last < self.every_n:
                return False
            if self.budget >= 1.0:
                return True
            return self._attr_spent_s <= self.budget * self._forward_s

    def may_learn(self) -> bool:
        """May a forward the budget did not pick be attributed if its shape is new to the memory
        model? The caller then reads the shape and, for a new one, asks ``claim``; for a known one
        says ``known``. Reading a shape costs microseconds (7-15 us measured), too much for every
        forward of a service whose shapes repeat: after a look that found a known shape the next
        looks wait 1, 2, 4 ... up to ``LEARN_WAIT_MAX`` forwards (up to ``LEARN_WAIT_DENIED`` after a
        new shape the learning budget had no room for), and a new shape attributed brings them
        back to every forward."""
        if not self.enabled or self.learning_budget <= 0.0:
            return False
        with self._lock:
            if self._since_last < self.every_n:
                return False
            if self._learn_wait > 0:
                self._learn_wait -= 1
                return False
            # some kind (of the two: prompts, decode steps) may still have its first forwards
            first_left = len(self._learned) < 2 or min(self._learned.values()) < self.LEARN_FIRST
            return first_left or self._learning_allowed()

    def _learning_allowed(self) -> bool:
        return self._attr_spent_s <= max(self.budget, self.learning_budget) * self._forward_s

    def claim(self, kind: str) -> bool:
        """A new shape of ``kind`` (the memory model's regime: prompts, decode steps) was found: may
        its forward be attributed? Each kind has its own ``LEARN_FIRST`` (a generate() service's
        decode steps, each a new cache length, would otherwise take them all before its prompts
        had any), then the learning budget."""
        with self._lock:
            if self._learned.get(kind, 0) < self.LEARN_FIRST or self._learning_allowed():
                self._learned[kind] = self._learned.get(kind, 0) + 1
                self._learn_gap = 0
                return True
            # traffic of ever-new shapes past the learning budget: look less often, but not for long
            # (the denied shape may be a decode step, and the next look a prompt whose kind has room)
            self._back_off(self.LEARN_WAIT_DENIED)
            return False

    def known(self) -> None:
        """The shape ``may_learn`` allowed a look at was one the model knows: the next looks wait longer."""
        with self._lock:
            self._back_off()

    def _back_off(self, cap: int = 0) -> None:
        self._learn_gap = min(cap or self.LEARN_WAIT_MAX, max(1, 2 * self._learn_gap))
        self._learn_wait = self._learn_gap

    def record(self, duration_s: float, attributed: bool, self_timed_s: float, on_demand: bool = False) -> float:
        """Account one finished forward; returns the attribution cost charged for it. ``on_demand``:
        attributed because a capture or a measuring window asked: its cost is overhead all the
        same, but not the sampling's to pay back, and the sampling's cadence goes on as it was."""
        with self._lock:
            self._forwards += 1
            if attributed:
                self._attributed += 1
                self._since_last = self._since_last + 1 if on_demand else 1
                base = self._plain_ema
                cost = duration_s if base is None else max(self_timed_s, duration_s - base)
                cost = min(cost, duration_s)
            else:
                self._since_last += 1
                cost = self_timed_s
                plain = max(0.0, duration_s - self_timed_s)
                if self._plain_ema is None:
                    self._plain_ema = plain
                    self._recharge_first(plain)
                else:
                    self._plain_ema += self._EMA_ALPHA * (plain - self._plain_ema)
            self._spent_s += cost
            if attributed and not on_demand:
                self._attr_spent_s += cost
            self._forward_s += max(0.0, duration_s - cost)
            if self._first_cost_s is None:
                self._first_cost_s = cost
                self._first_plain_s = max(0.0, duration_s - cost)
                if attributed and not on_demand and self._plain_ema is None:  # charged whole: recharged later
                    self._first_attributed_s = duration_s
                    self._first_self_timed_s = self_timed_s
            return cost

    def _recharge_first(self, plain_s: float) -> None:
        """The first forward, attributed with no plain one to compare against, was charged whole,
        and it is a cold one (lazy initialisation, first allocations): at a 0.2 % budget that
        debt kept attribution off for minutes (one attributed forward in 65,000 over four minutes,
        measured on a small GPT-2 on CPU), and with it everything that learns from attributed
        forwards. Once a plain forward is seen, the first is charged like any other, capped at
        ``FIRST_COST_CAP`` plain forwards (an attributed forward measured 1.07-1.3x a plain one on
        CPU, 2-3x on CUDA), never below what its hooks timed themselves."""
        if self._first_cost_s is None or self._first_attributed_s is None:
            return
        duration = self._first_cost_s + self._first_plain_s
        cost = max(self._first_self_timed_s, min(duration - plain_s, self.FIRST_COST_CAP * plain_s))
        cost = min(cost, self._first_cost_s)
        self._spent_s -= self._first_cost_s - cost
        self._attr_spent_s -= self._first_cost_s - cost
        self._forward_s += self._first_cost_s - cost
        self._first_plain_s += self._first_cost_s - cost
        self._first_cost_s = cost
        self._first_attributed_s = None  # recharged once

    def state(self) -> SchedulerState:
        with self._lock:
            return SchedulerState(self._forwards, self._attributed, self._forward_s, self._spent_s,
                                  self._plain_ema, self._first_cost_s or 0.0, self._first_plain_s,
                                  sum(self._learned.values()))
