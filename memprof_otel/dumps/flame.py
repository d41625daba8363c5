"""The plain data of one flame graph, shared by the speedscope and the pprof files of a dump.

A ``Flame`` is what both formats are built from: merged stacks (root -> leaf frame names), one
value per sample type for each (the first sample type is the one the speedscope file weighs its
samples by), frame source lines where frames are Python code, labels and times. Pure: no torch,
no protobuf, no I/O.

A stored dump is a speedscope file; what pprof needs beyond it (the other sample types' values,
the labels, the times, source lines) travels in the same document under ``SIDE_KEY``, an extra
top-level key speedscope ignores (its schema allows additional properties). ``flame_from_speedscope``
reads a stored document back into a ``Flame``: the first sample type's values *are* the speedscope
weights, so the pprof totals equal the speedscope ones by construction.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SIDE_KEY = "memprof_otel"   # the speedscope document's extra key; its "pprof" entry is ours

# what a speedscope document stored before the side entry existed converts to
_LEGACY_SAMPLE_TYPE = ("space", "bytes")


@dataclass(frozen=True)
class Flame:
    """``stacks[i]`` (root first) weighs ``values[i]`` (one int per ``sample_types`` entry, a
    ``(type, unit)`` pair such as ``("alloc_space", "bytes")``). ``frame_lines``: frame name ->
    ``(file, line)`` for frames that are source lines. ``labels``: ``(key, value)`` pairs that hold
    for every sample (model, device, operation). ``time_nanos``: when the recording started (unix
    epoch, ns); ``duration_nanos``: how long it covered (0: unknown)."""

    sample_types: tuple[tuple[str, str], ...]
    stacks: tuple[tuple[str, ...], ...]
    values: tuple[tuple[int, ...], ...]
    frame_lines: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    labels: tuple[tuple[str, str], ...] = ()
    time_nanos: int = 0
    duration_nanos: int = 0
    period_type: tuple[str, str] = ("space", "bytes")
    comments: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.sample_types:
            raise ValueError("a flame needs at least one sample type")
        if len(self.stacks) != len(self.values):
            raise ValueError(f"{len(self.stacks)} stacks but {len(self.values)} value rows")
        for v in self.values:
            if len(v) != len(self.sample_types):
                raise ValueError(f"each sample needs {len(self.sample_types)} values, got {len(v)}")

    def totals(self) -> tuple[int, ...]:
        """The sum of each sample type's values over every sample."""
        return tuple(sum(col) for col in zip(*self.values)) if self.values else (0,) * len(self.sample_types)

    def weighted(self) -> list[tuple[tuple[str, ...], int]]:
        """``(stack, first value)`` pairs: the speedscope builder's input."""
        return [(s, v[0]) for s, v in zip(self.stacks, self.values)]

    def side_entry(self) -> dict[str, Any]:
        """What the speedscope document carries for pprof (``doc[SIDE_KEY]["pprof"]``): the values of
        the sample types after the first, per sample in the order of the sampled profile."""
        return {"sample_types": [list(t) for t in self.sample_types],
                "more_values": [list(v[1:]) for v in self.values],
                "frame_lines": {k: [f, n] for k, (f, n) in self.frame_lines.items()},
                "labels": [list(kv) for kv in self.labels],
                "time_nanos": self.time_nanos, "duration_nanos": self.duration_nanos,
                "period_type": list(self.period_type), "comments": list(self.comments)}


def _pairs(raw: Any, what: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list) or not all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
                                            for p in raw):
        raise ValueError(f"{what}: expected a list of [string, string] pairs")
    return tuple((p[0], p[1]) for p in raw)


def _int(raw: Any, what: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"{what}: expected an integer, got {raw!r:.40}")
    return raw


def flame_from_speedscope(doc: Any) -> Flame:
    """The ``Flame`` of a stored speedscope document (its first profile, which must be ``sampled``).
    ``ValueError`` when it is not a flame graph (an OOM record, a CUDA snapshot) or is malformed.
    A document without the side entry gives one sample type, ``("space", <its unit>)``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("profiles"), list) or not doc["profiles"]:
        raise ValueError("not a speedscope document")
    prof = doc["profiles"][0]
    if not isinstance(prof, dict) or prof.get("type") != "sampled":
        raise ValueError("its first profile is not a sampled flame graph")
    try:
        names = [f["name"] for f in doc["shared"]["frames"]]
        stacks = tuple(tuple(str(names[_int(i, "frame index")]) for i in s) for s in prof["samples"])
        weights = [_int(w, "weight") for w in prof["weights"]]
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"malformed speedscope document: {e!r}") from None
    if len(stacks) != len(weights):
        raise ValueError("malformed speedscope document: samples and weights differ in length")
    side = doc.get(SIDE_KEY, {}).get("pprof") if isinstance(doc.get(SIDE_KEY), dict) else None
    if side is None:
        unit = prof.get("unit") if isinstance(prof.get("unit"), str) else "bytes"
        return Flame((( _LEGACY_SAMPLE_TYPE[0], unit),), stacks, tuple((w,) for w in weights))
    if not isinstance(side, dict):
        raise ValueError(f"{SIDE_KEY}.pprof: expected an object")
    types = _pairs(side.get("sample_types"), "sample_types")
    more = side.get("more_values")
    if not isinstance(more, list) or len(more) != len(weights):
        raise ValueError("more_values: expected one row per sample")
    values = tuple((w, *(_int(x, "value") for x in row)) for w, row in zip(weights, more))
    lines = side.get("frame_lines") or {}
    if not isinstance(lines, dict):
        raise ValueError("frame_lines: expected an object")
    frame_lines = {}
    for k, v in lines.items():
        if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)):
            raise ValueError("frame_lines: expected [file, line] values")
        frame_lines[k] = (v[0], _int(v[1], "line"))
    comments = side.get("comments") or []
    if not isinstance(comments, list) or not all(isinstance(c, str) for c in comments):
        raise ValueError("comments: expected a list of strings")
    return Flame(types, stacks, values, frame_lines, _pairs(side.get("labels") or [], "labels"),
                 _int(side.get("time_nanos", 0), "time_nanos"), _int(side.get("duration_nanos", 0), "duration_nanos"),
                 _pairs([side.get("period_type") or list(_LEGACY_SAMPLE_TYPE)], "period_type")[0], tuple(comments))
