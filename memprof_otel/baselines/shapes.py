"""Per-shape figures for a baseline: what one model's layers did on each input shape it was given,
the median over that shape's forwards and their spread. Pure.

A live service's forwards come in many shapes, and a layer's peak grows with the batch and the
sequence: a baseline that keeps one maximum over whichever forwards it happened to measure compares
a diff's two sides on different inputs. Kept per shape, a figure is compared only with the same
figure on the same shape, and the spread of repeat forwards of one shape (which a real allocator
has: glibc's heap, a cache warming up) is the noise a threshold must be above.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

# at least this many forwards of a shape for its figures to be judged: below it the spread is not
# known, and the diff names the figure unknown rather than changed
MIN_FORWARDS = 3


class Call(Protocol):
    """One closed layer call (``attribution.peaks.LayerCall`` has these)."""
    @property
    def path(self) -> str: ...
    @property
    def peak_increase(self) -> int: ...
    @property
    def retained(self) -> int: ...
    @property
    def allocations(self) -> int: ...
    @property
    def frees(self) -> int: ...


def shape_key(features: Mapping[str, int] | None) -> str:
    """``batch=3,seq_len=11`` (names sorted); ``""`` for a forward whose shape was not read."""
    return ",".join(f"{k}={int(v)}" for k, v in sorted((features or {}).items()))


def forward_layers(calls: Iterable[Call]) -> dict[str, dict[str, int]]:
    """One forward's figures per layer: the byte figures the largest over its calls, the counts summed."""
    out: dict[str, dict[str, int]] = {}
    for c in calls:
        f = out.get(c.path)
        if f is None:
            out[c.path] = {"peak_increase_bytes": int(c.peak_increase), "retained_bytes": int(c.retained),
                           "calls": 1, "allocations": int(c.allocations), "deallocations": int(c.frees)}
            continue
        f["peak_increase_bytes"] = max(f["peak_increase_bytes"], int(c.peak_increase))
        f["retained_bytes"] = max(f["retained_bytes"], int(c.retained))
        f["calls"] += 1
        f["allocations"] += int(c.allocations)
        f["deallocations"] += int(c.frees)
    return out


def _median(values: list[int]) -> int:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2


@dataclass(frozen=True)
class ShapeFigures:
    """One shape: its features, how many forwards, per layer each figure's median and spread (max - min)."""
    features: Mapping[str, int]
    forwards: int
    median: Mapping[str, Mapping[str, int]]   # path -> figure -> median over the forwards
    spread: Mapping[str, Mapping[str, int]]   # path -> figure -> max - min over the forwards

    @property
    def key(self) -> str:
        return shape_key(self.features)


class ShapeAccumulator:
    """Forwards' per-layer figures, kept per shape until ``shapes()`` sums them up (not thread-safe:
    its owner holds a lock)."""

    def __init__(self) -> None:
        self._by: dict[str, tuple[dict[str, int], list[dict[str, dict[str, int]]]]] = {}
        self.forwards = 0

    def add(self, features: Mapping[str, int] | None, layers: dict[str, dict[str, int]]) -> None:
        key = shape_key(features)
        entry = self._by.setdefault(key, ({k: int(v) for k, v in (features or {}).items()}, []))
        entry[1].append(layers)
        self.forwards += 1

    def shapes(self) -> list[ShapeFigures]:
        """Every shape seen, most forwards first (then by key)."""
        out = []
        for _, (features, forwards) in sorted(self._by.items(), key=lambda kv: (-len(kv[1][1]), kv[0])):
            paths = sorted({p for fw in forwards for p in fw})
            median: dict[str, dict[str, int]] = {}
            spread: dict[str, dict[str, int]] = {}
            for p in paths:
                rows = [fw[p] for fw in forwards if p in fw]
                median[p] = {f: _median([r[f] for r in rows]) for f in rows[0]}
                spread[p] = {f: max(r[f] for r in rows) - min(r[f] for r in rows) for f in rows[0]}
            out.append(ShapeFigures(features, len(forwards), median, spread))
        return out


def to_doc(s: ShapeFigures) -> dict[str, Any]:
    return {"features": dict(s.features), "forwards": s.forwards,
            "layers": {p: {"median": dict(s.median[p]), "spread": dict(s.spread[p])} for p in sorted(s.median)}}
