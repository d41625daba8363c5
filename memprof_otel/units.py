"""Parsing of human units in config values: ``20GiB``, ``512MB``, ``500ms``, ``2m``."""
from __future__ import annotations

import datetime
import math
import re
from typing import Any, Callable

from .errors import shown

_BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "m": 60.0, "h": 3600.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-zµ]*)\s*$")


def parse_bytes(value: object) -> int:
    """``20GiB`` -> 21474836480. Plain numbers are bytes. Raises ValueError on junk."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"size must be >= 0: {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"not a size: {value!r}")
    m = _NUMBER_UNIT.match(value)
    if not m or m.group(2).lower() not in _BYTE_UNITS:
        raise ValueError(f"not a size (try 512MiB, 20GiB, 1e9): {value!r}")
    return int(float(m.group(1)) * _BYTE_UNITS[m.group(2).lower()])


def parse_duration(value: object) -> float:
    """``500ms`` -> 0.5, ``2m`` -> 120.0. Plain numbers are seconds."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"duration must be >= 0: {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"not a duration: {value!r}")
    m = _NUMBER_UNIT.match(value)
    if not m or m.group(2) not in _TIME_UNITS:
        raise ValueError(f"not a duration (try 500ms, 10s, 2m): {value!r}")
    return float(m.group(1)) * _TIME_UNITS[m.group(2)]


def bounded_duration(lo: float, hi: float = float("inf")) -> Callable[[Any], float]:
    """A parser of durations between ``lo`` and ``hi`` seconds (ValueError outside, or infinite)."""
    def parse(v: Any) -> float:
        try:
            x = parse_duration(v)
        except OverflowError:  # an integer with hundreds of digits
            raise ValueError(f"must be a finite duration, got {shown(v)}") from None
        if not math.isfinite(x):  # "1e999s" parses to inf: no timer can wait that long
            raise ValueError(f"must be a finite duration, got {v!r}")
        if not lo <= x <= hi:
            raise ValueError(f"must be between {lo}s and {hi}s, got {x}s")
        return x
    return parse


def format_bytes(n: float) -> str:
    """IEC, one decimal: 1536 -> '1.5 KiB'. Negative values keep their sign."""
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_metric_value(metric: str, value: float) -> str:
    """A metric's value in the unit its name carries, for people: bytes as KiB/MiB/GiB, ratios as
    percent, seconds with an ``s`` (``memprof_allocator_fragmentation_ratio``, 0.314 -> '31.4 %')."""
    x = float(value)
    if x != x:  # NaN: a series with no number
        return "NaN"
    if metric.endswith("_bytes_per_second"):
        return format_bytes(x) + "/s"
    if "_bytes" in metric:
        return format_bytes(x)
    if metric.endswith("_ratio"):
        return f"{x * 100:.1f} %"
    if metric.endswith("_timestamp_seconds"):
        return datetime.datetime.fromtimestamp(x, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if "_seconds" in metric:
        return f"{x:.3g} s"
    return f"{x:g}"
