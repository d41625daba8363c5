"""Watchdog rules: what one is (``WatchdogRule``) and how a rule mapping is validated, from the config
(``watchdog.rules``) or from ``PUT /v1/watchdog/rules``. Pure: no state, no I/O; a rule that cannot
hold is a ``ConfigError`` naming its dotted position. The engine that evaluates rules is
``engine.py``; the service that runs it on every sampler tick is ``service.py``.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, shown as _shown
from ..metric_names import BY_PROM, METRICS
from ..units import bounded_duration, parse_bytes, parse_duration

RULE_OPS = (">", ">=", "<", "<=")
RULE_ACTIONS = ("log", "span_event", "callback", "dump")
RULE_SEVERITIES = ("info", "warning", "critical")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}")
_METRIC_RE = re.compile(r"memprof_[a-z0-9_]{1,200}")
_LABEL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_RULES = 256
MAX_RULE_LABELS = 32
MAX_LABEL_VALUE_CHARS = 1024


@dataclass(frozen=True)
class WatchdogRule:
    name: str
    metric: str                      # a memprof_* Prometheus metric name
    op: str                          # one of RULE_OPS
    threshold: float                 # base units (bytes, seconds, ratio)
    for_seconds: float = 0.0         # how long the condition must hold before firing
    severity: str = "warning"
    actions: tuple[str, ...] = ("log",)
    labels: tuple[tuple[str, str], ...] = ()  # label matchers, all must equal

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "metric": self.metric, "op": self.op, "threshold": self.threshold,
                "for": self.for_seconds, "severity": self.severity, "actions": list(self.actions),
                "labels": dict(self.labels)}


MAX_THRESHOLD_CHARS = 64


def parse_threshold(v: Any) -> float:
    """A finite number: a NaN or infinite threshold never compares usefully and cannot be
    written back as JSON, so it is refused here rather than stored."""
    x = _threshold_value(v)
    if not math.isfinite(x):
        raise ValueError(f"must be a finite number, got {v!r}")
    return x


def _threshold_value(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError(f"not a threshold: {v!r}")
    if isinstance(v, int):
        try:
            return float(v)
        except OverflowError:  # a JSON integer with hundreds of digits
            raise ValueError("must be a finite number, got an integer too large for a float") from None
    if isinstance(v, float):
        return v
    if isinstance(v, str) and len(v) <= MAX_THRESHOLD_CHARS:
        for parse in (float, parse_bytes, parse_duration):
            try:
                return float(parse(v))
            except (ValueError, OverflowError):
                pass
    shown = v if not isinstance(v, str) or len(v) <= MAX_THRESHOLD_CHARS else v[:MAX_THRESHOLD_CHARS] + "..."
    raise ValueError(f"not a threshold (a number, a size like 20GiB or a duration like 500ms): {shown!r}")


def parse_rule(raw: Any, where: str) -> WatchdogRule:
    """Validate one rule mapping; ``where`` is its dotted position for error messages."""
    if not isinstance(raw, Mapping):
        raise ConfigError(where, f"a rule must be a mapping, got {type(raw).__name__}")
    known = {"name", "metric", "op", "threshold", "for", "severity", "actions", "labels"}
    for k in raw:
        if k not in known:
            raise ConfigError(f"{where}.{k}", f"unknown rule key (known: {', '.join(sorted(known))})")
    for k in ("name", "metric", "op", "threshold"):
        if k not in raw:
            raise ConfigError(f"{where}.{k}", "missing")
    name, metric, op = raw["name"], raw["metric"], raw["op"]
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigError(f"{where}.name", f"must be an identifier-like string of 1..128 chars, got {_shown(name)}")
    if not isinstance(metric, str) or not _METRIC_RE.fullmatch(metric):
        raise ConfigError(f"{where}.metric", f"must be a memprof_* metric name, got {_shown(metric)}")
    if op not in RULE_OPS:
        raise ConfigError(f"{where}.op", f"must be one of {' '.join(RULE_OPS)}, got {_shown(op)}")
    try:
        threshold = parse_threshold(raw["threshold"])
    except ValueError as e:
        raise ConfigError(f"{where}.threshold", str(e)) from None
    try:
        for_s = bounded_duration(0.0, 86400.0)(raw.get("for", 0))
    except ValueError as e:
        raise ConfigError(f"{where}.for", str(e)) from None
    severity = raw.get("severity", "warning")
    if severity not in RULE_SEVERITIES:
        raise ConfigError(f"{where}.severity", f"must be one of {', '.join(RULE_SEVERITIES)}, got {_shown(severity)}")
    actions = raw.get("actions", ["log"])
    if isinstance(actions, str):
        actions = [actions]
    if not isinstance(actions, (list, tuple)) or any(a not in RULE_ACTIONS for a in actions):
        raise ConfigError(f"{where}.actions",
                          f"must be a list drawn from {', '.join(RULE_ACTIONS)}, got {_shown(actions)}")
    labels = raw.get("labels")
    labels = {} if labels is None else labels  # an empty YAML key; but [] or "" are not label sets
    _check_labels(labels, f"{where}.labels")
    _check_watchable(metric, labels, where)
    return WatchdogRule(name, metric, op, threshold, for_s, severity, tuple(actions), tuple(sorted(labels.items())))


def _check_labels(labels: Any, where: str) -> None:
    if not isinstance(labels, Mapping) or len(labels) > MAX_RULE_LABELS:
        raise ConfigError(where, f"must be a mapping of at most {MAX_RULE_LABELS} label names to string values")
    for k, v in labels.items():
        if not isinstance(k, str) or not _LABEL_RE.fullmatch(k):
            raise ConfigError(where, f"label names must be Prometheus label names, got {_shown(k)}")
        if not isinstance(v, str) or len(v) > MAX_LABEL_VALUE_CHARS:
            raise ConfigError(f"{where}.{k}", f"must be a string of at most {MAX_LABEL_VALUE_CHARS} chars")


def _check_watchable(metric: str, labels: Mapping[str, str], where: str) -> None:
    """A rule must watch a series the watchdog sees: a gauge or counter of the metric catalog
    (a rule on a name that does not exist would never fire, and nobody would be told)."""
    d = BY_PROM.get(metric)
    if d is None:
        raise ConfigError(f"{where}.metric", f"unknown metric {_shown(metric)}: rules watch the memprof_* "
                          "gauges and counters of docs/metrics.md")
    if d.kind not in WATCHABLE_KINDS:
        watchable = sum(1 for m in METRICS if m.kind in WATCHABLE_KINDS)
        raise ConfigError(f"{where}.metric", f"{metric} is a {d.kind}; rules watch gauges and counters "
                          f"({watchable} metrics)")
    unknown = sorted(set(labels) - set(d.labels))
    if unknown:
        raise ConfigError(f"{where}.labels", f"{metric} has no label {', '.join(unknown)} "
                          f"(its labels: {', '.join(d.labels) or 'none'})")


WATCHABLE_KINDS = ("gauge", "counter")


def parse_rules(v: Any) -> tuple[WatchdogRule, ...]:
    """``watchdog.rules``: a list of rule mappings (or, from an environment variable, its JSON);
    ValueError for anything else, for more than ``MAX_RULES`` or for a repeated name."""
    if isinstance(v, str):  # from an env var: JSON list
        try:
            v = json.loads(v)
        except json.JSONDecodeError as e:
            raise ValueError(f"expected a JSON list of rules: {e}") from None
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"expected a list of rules, got {type(v).__name__}")
    if len(v) > MAX_RULES:
        raise ValueError(f"at most {MAX_RULES} rules, got {len(v)}")
    rules = tuple(r if isinstance(r, WatchdogRule) else parse_rule(r, f"watchdog.rules[{i}]")
                  for i, r in enumerate(v))
    names = [r.name for r in rules]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"rule names must be unique, repeated: {', '.join(sorted(dup))}")
    return rules
