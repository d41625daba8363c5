"""Building PromQL selectors from the configured matchers, and numbers written for people."""
from __future__ import annotations

import re

_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_WORDS = {"ms": "millisecond", "s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week",
               "y": "year"}


def matchers(*parts: str) -> str:
    """Non-empty matcher lists joined with ", "."""
    return ", ".join(p for p in parts if p)


def series(name: str, *parts: str) -> str:
    """``name{parts...}``, or the bare name when there is no matcher at all."""
    inside = matchers(*parts)
    return f"{name}{{{inside}}}" if inside else name


def number(x: float) -> str:
    """A threshold as PromQL: exact (no rounding), without a trailing .0 (1073741824, 0.3)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def duration_words(duration: str) -> str:
    """'2m' -> '2 minutes', '1h30m' -> '1 hour 30 minutes'."""
    words = []
    for n, unit in _DURATION_PART.findall(duration):
        words.append(f"{n} {_UNIT_WORDS[unit]}{'' if n == '1' else 's'}")
    return " ".join(words)


def duration_seconds(duration: str) -> float:
    """'10m' -> 600.0, '1h30m' -> 5400.0, '500ms' -> 0.5 (a Prometheus duration as seconds, for
    the functions that take a number, such as predict_linear's horizon)."""
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return float(sum(int(n) * scale[unit] for n, unit in _DURATION_PART.findall(duration)))


def percent(ratio: float) -> str:
    """0.9 -> '90%', 0.125 -> '12.5%'."""
    return f"{ratio * 100:g}%"


def iec_bytes(n: float) -> str:
    """1073741824 -> '1 GiB', 268435456 -> '256 MiB' (the largest unit that keeps it >= 1)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def seconds_words(s: float) -> str:
    """0.5 -> '500ms', 60 -> '60s' (as Prometheus' humanizeDuration would write short ones)."""
    return f"{s * 1000:g}ms" if s < 1 else f"{s:g}s"
