"""Prometheus-style alert states for watchdog rules: a pure state machine over scraped values.

``AlertEngine.evaluate(values, now)`` takes what a scrape shows (metric name -> ``(labels, value)``
pairs) and the time, and returns the state changes. No threads, no I/O, no clock: the watchdog
service reads the metrics, passes ``now`` and acts on the transitions (log, span event, dump).

Each label set of a rule's metric that carries all the rule's label matchers is its own alert
instance, as in Prometheus::

    inactive --cond--> pending --cond held for `for`--> firing --not cond / series gone--> resolved
       ^                  |                                                                  |
       +--- not cond / ---+                      cond again: pending (firing if for=0) <-----+
       +------------------------------ kept resolved_retention_s, then dropped --------------+

With ``for_seconds == 0`` an instance goes straight from inactive (or resolved) to firing: one
transition, ``old -> "firing"``. NaN never satisfies a condition.

Not thread-safe: the caller holds one lock around every call on an engine.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable

from .rules import RULE_OPS, WatchdogRule

INACTIVE, PENDING, FIRING, RESOLVED = "inactive", "pending", "firing", "resolved"

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
}

Series = Mapping[str, Sequence[tuple[Mapping[str, str], float]]]
_LabelKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Transition:
    """One alert instance changed state (``old``/``new`` in inactive, pending, firing, resolved)."""

    rule: WatchdogRule
    labels: dict[str, str]
    old: str
    new: str
    value: float
    at: float


@dataclass
class _Instance:
    state: str
    since: float         # when the current state began
    active_since: float  # when it last became pending (or firing, with for=0)
    value: float


def condition_holds(rule: WatchdogRule, value: float) -> bool:
    """``value <op> threshold``; NaN (and anything not a number) never holds."""
    if math.isnan(value):
        return False
    return _OPS[rule.op](value, rule.threshold)


def matching_series(rule: WatchdogRule, values: Series) -> dict[_LabelKey, float]:
    """Label set -> value for every series of the rule's metric carrying all its label matchers.

    A label set listed twice keeps its last value; a value that is not a number counts as NaN.
    """
    out: dict[_LabelKey, float] = {}
    for labels, value in values.get(rule.metric, ()):
        if all(labels.get(k) == v for k, v in rule.labels):
            out[tuple(sorted((str(k), str(v)) for k, v in labels.items()))] = _as_float(value)
    return out


def _as_float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _json_number(x: float) -> float | None:
    return x if math.isfinite(x) else None


class AlertEngine:
    """Alert instances of a rule set, advanced by ``evaluate``. See the module docstring."""

    def __init__(self, rules: Iterable[WatchdogRule] = (), resolved_retention_s: float = 900.0) -> None:
        if not resolved_retention_s >= 0:
            raise ValueError(f"resolved_retention_s must be >= 0, got {resolved_retention_s}")
        self.resolved_retention_s = float(resolved_retention_s)
        self._rules: dict[str, WatchdogRule] = {}
        self._instances: dict[str, dict[_LabelKey, _Instance]] = {}
        self._fired: dict[tuple[str, str], int] = {}
        self.set_rules(rules)

    @property
    def rules(self) -> tuple[WatchdogRule, ...]:
        return tuple(self._rules.values())

    def set_rules(self, rules: Iterable[WatchdogRule]) -> None:
        """Replace the rule set.

        A rule kept with the same name and an identical definition keeps its instances; a changed
        one starts over; a removed one loses its instances. ``fired_total`` keeps the counts of
        ``(rule, severity)`` pairs still present.
        """
        new: dict[str, WatchdogRule] = {}
        for r in rules:
            if not isinstance(r, WatchdogRule):
                raise TypeError(f"expected WatchdogRule, got {type(r).__name__}")
            if r.op not in _OPS:
                raise ValueError(f"rule {r.name!r}: op must be one of {' '.join(RULE_OPS)}, got {r.op!r}")
            if r.name in new:
                raise ValueError(f"rule names must be unique, repeated: {r.name}")
            new[r.name] = r
        self._instances = {name: (self._instances.get(name, {}) if self._rules.get(name) == r else {})
                           for name, r in new.items()}
        self._fired = {(r.name, r.severity): self._fired.get((r.name, r.severity), 0) for r in new.values()}
        self._rules = new

    def evaluate(self, values: Series, now: float) -> list[Transition]:
        """Advance every instance to ``now`` given the current ``values``; return the state changes."""
        out: list[Transition] = []
        for name, rule in self._rules.items():
            insts = self._instances[name]
            present = matching_series(rule, values)
            for key, value in present.items():
                inst = insts.get(key)
                if condition_holds(rule, value):
                    self._on_true(rule, insts, key, inst, value, now, out)
                elif inst is not None:
                    inst.value = value
                    self._on_false(rule, insts, key, inst, now, out)
            for key in [k for k in insts if k not in present]:
                self._on_false(rule, insts, key, insts[key], now, out)
        return out

    def _on_true(self, rule: WatchdogRule, insts: dict[_LabelKey, _Instance], key: _LabelKey,
                 inst: _Instance | None, value: float, now: float, out: list[Transition]) -> None:
        if inst is None or inst.state == RESOLVED:
            old = INACTIVE if inst is None else RESOLVED
            new = FIRING if rule.for_seconds <= 0 else PENDING
            insts[key] = _Instance(new, now, now, value)
            self._emit(rule, key, old, new, value, now, out)
            return
        inst.value = value
        if inst.state == PENDING and now - inst.active_since >= rule.for_seconds:
            self._move(rule, key, inst, FIRING, now, out)

    def _on_false(self, rule: WatchdogRule, insts: dict[_LabelKey, _Instance], key: _LabelKey,
                  inst: _Instance, now: float, out: list[Transition]) -> None:
        if inst.state == PENDING:
            del insts[key]
            self._emit(rule, key, PENDING, INACTIVE, inst.value, now, out)
        elif inst.state == FIRING:
            self._move(rule, key, inst, RESOLVED, now, out)
        elif inst.state == RESOLVED and now - inst.since >= self.resolved_retention_s:
            del insts[key]
            self._emit(rule, key, RESOLVED, INACTIVE, inst.value, now, out)

    def _move(self, rule: WatchdogRule, key: _LabelKey, inst: _Instance, new: str, now: float,
              out: list[Transition]) -> None:
        old, inst.state, inst.since = inst.state, new, now
        self._emit(rule, key, old, new, inst.value, now, out)

    def _emit(self, rule: WatchdogRule, key: _LabelKey, old: str, new: str, value: float, now: float,
              out: list[Transition]) -> None:
        if new == FIRING:
            k = (rule.name, rule.severity)
            self._fired[k] = self._fired.get(k, 0) + 1
        out.append(Transition(rule, dict(key), old, new, value, now))

    def alerts(self) -> list[dict[str, Any]]:
        """Pending, firing and resolved instances as JSON-able dicts (rule order, then labels).

        Non-finite numbers (a NaN last value, an infinite threshold) are given as ``None``.
        """
        out = []
        for name, rule in self._rules.items():
            for key, inst in sorted(self._instances[name].items()):
                out.append({
                    "rule": name, "severity": rule.severity, "state": inst.state, "since": inst.since,
                    "active_since": inst.active_since, "value": _json_number(inst.value),
                    "threshold": _json_number(rule.threshold), "op": rule.op, "metric": rule.metric,
                    "labels": dict(key),
                })
        return out

    def active_count(self, rule_name: str) -> int:
        """Firing instances of a rule (0 for an unknown rule): the value of ``memprof_alert_active``."""
        return sum(1 for i in self._instances.get(rule_name, {}).values() if i.state == FIRING)

    def fired_total(self) -> dict[tuple[str, str], int]:
        """``(rule, severity)`` -> transitions into firing; every current rule is listed (0 if none)."""
        return dict(self._fired)
