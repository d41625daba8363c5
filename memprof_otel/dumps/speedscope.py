"""Build speedscope files (https://www.speedscope.app/file-format-schema.json) from plain data.

Pure functions: no torch, no I/O. A capture hands us ``(stack, bytes)`` pairs and module-call
open/close events; we return the JSON-able document. Two profiles: a ``sampled`` one weighted in
``bytes`` (stacks root -> leaf module -> op, each sample's weight the bytes allocated there) and an
``evented`` one in ``milliseconds`` with the time-ordered module calls.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"


class _Frames:
    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.frames: list[dict[str, Any]] = []

    def id(self, name: str) -> int:
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.frames)
            self.frames.append({"name": name})
        return i


def build_speedscope(name: str, allocations: Iterable[tuple[Sequence[str], int]],
                     calls: Sequence[tuple[str, str, float]], *, exporter: str,
                     measure: str = "bytes allocated") -> dict[str, Any]:
    """``allocations``: (stack root->leaf, bytes); identical stacks are merged, order of first
    appearance kept. ``calls``: ("O" or "C", frame name, time in seconds), properly nested.
    ``measure`` names what the bytes are, in the sampled profile's name."""
    frames = _Frames()
    merged: dict[tuple[str, ...], int] = {}
    for stack, nbytes in allocations:
        if nbytes > 0:
            key = tuple(stack)
            merged[key] = merged.get(key, 0) + int(nbytes)
    samples = [[frames.id(f) for f in stack] for stack in merged]
    weights = list(merged.values())
    total = sum(weights)
    profiles: list[dict[str, Any]] = [{
        "type": "sampled", "name": f"{name}: {measure}", "unit": "bytes",
        "startValue": 0, "endValue": total, "samples": samples, "weights": weights,
    }]
    if calls:
        t0 = calls[0][2]
        events = [{"type": kind, "frame": frames.id(frame), "at": (t - t0) * 1000.0} for kind, frame, t in calls]
        profiles.append({
            "type": "evented", "name": f"{name}: module calls", "unit": "milliseconds",
            "startValue": 0.0, "endValue": events[-1]["at"], "events": events,
        })
    return {
        "$schema": SCHEMA_URL,
        "shared": {"frames": frames.frames},
        "profiles": profiles,
        "name": name,
        "activeProfileIndex": 0,
        "exporter": exporter,
    }


def balanced_calls(calls: Iterable[tuple[str, str, float]]) -> list[tuple[str, str, float]]:
    """Drop closes that match no open frame and close what is left open, so speedscope accepts it
    (a forward that raised leaves frames whose close hook never ran)."""
    out: list[tuple[str, str, float]] = []
    stack: list[str] = []
    last = 0.0
    for kind, frame, t in calls:
        last = max(last, t)
        if kind == "O":
            stack.append(frame)
            out.append((kind, frame, t))
        elif frame in stack:
            while stack:
                top = stack.pop()
                out.append(("C", top, t))
                if top == frame:
                    break
    while stack:
        out.append(("C", stack.pop(), last))
    return out
