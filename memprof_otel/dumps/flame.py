"""The plain data of one flame graph, shared by the speedscope and the pprof files of a dump.

A ``Flame`` is what both formats are built from: merged stacks (root -> leaf frame names), one
value per sample type for each (the first sample type is the one the speedscope file weighs its
samples by), frame source lines where frames are Python code, labels and times. Pure: no torch,
no protobuf, no I/O.

Reading a stored file back (``flame_from_stored``) is where a dump's bytes are checked, all in one
place: another process may have written them into a shared dump folder.

A stored dump is a speedscope file; what pprof needs beyond it (the other sample types' values,
the labels, the times, source lines) travels in the same document under ``SIDE_KEY``, an extra
top-level key speedscope ignores (its schema allows additional properties). ``flame_from_speedscope``
reads a stored document back into a ``Flame``: the first sample type's values *are* the speedscope
weights, so the pprof totals equal the speedscope ones by construction.
"""
from __future__ import annotations

import json
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


class NotAFlame(ValueError):
    """A stored document that is well-formed but no flame graph (an OOM record, a CUDA snapshot)."""


class MalformedDump(ValueError):
    """A stored document that claims to be a flame graph but breaks its rules: not JSON, nested too
    deep, a frame index out of range, a negative or non-integer value..."""


_INT64_MAX = (1 << 63) - 1  # every pprof value, line and time is an int64


def _pairs(raw: Any, what: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list) or not all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
                                            for p in raw):
        raise MalformedDump(f"{what}: expected a list of [string, string] pairs")
    return tuple((p[0], p[1]) for p in raw)


def _int(raw: Any, what: str, hi: int = _INT64_MAX) -> int:
    """A non-negative integer up to ``hi``: weights, values, lines, times and frame indices."""
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise MalformedDump(f"{what}: expected an integer, got {raw!r:.40}")
    if not 0 <= raw <= hi:
        raise MalformedDump(f"{what}: expected an integer in 0..{hi}, got {raw!r:.40}")
    return raw


def _list(raw: Any, what: str) -> list[Any]:
    if not isinstance(raw, list):
        raise MalformedDump(f"{what}: expected a list")
    return raw


def flame_from_stored(body: bytes) -> Flame:
    """The ``Flame`` of a stored dump file's bytes (see ``flame_from_speedscope``). The file may come
    from another process (a shared dump folder), so every way it can be wrong is a ``ValueError``:
    ``NotAFlame`` when it is another kind of dump, ``MalformedDump`` when it is broken."""
    try:
        doc = json.loads(body)
    except RecursionError:
        raise MalformedDump("nested too deep") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise MalformedDump(f"not JSON: {str(e)[:100]}") from None
    try:
        return flame_from_speedscope(doc)
    except RecursionError:  # a frame name nested near the interpreter's limit
        raise MalformedDump("nested too deep") from None


def flame_from_speedscope(doc: Any) -> Flame:
    """The ``Flame`` of a stored speedscope document (its first profile, which must be ``sampled``).
    ``NotAFlame`` when it is not a flame graph (an OOM record, a CUDA snapshot), ``MalformedDump``
    when it breaks the format: frame names must be strings, frame indices in range, weights and
    values non-negative int64s. A document without the side entry gives one sample type,
    ``("space", <its unit>)``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("profiles"), list) or not doc["profiles"]:
        raise NotAFlame("not a speedscope document")
    prof = doc["profiles"][0]
    if not isinstance(prof, dict) or prof.get("type") != "sampled":
        raise NotAFlame("its first profile is not a sampled flame graph")
    shared = doc.get("shared")
    frames = _list(shared.get("frames") if isinstance(shared, dict) else None, "shared.frames")
    names = [f.get("name") if isinstance(f, dict) else None for f in frames]
    if not all(isinstance(n, str) for n in names):
        raise MalformedDump("shared.frames: each frame needs a string name")
    last = len(names) - 1
    stacks = tuple(tuple(names[_int(i, "frame index", last)] for i in _list(s, "a sample"))
                   for s in _list(prof.get("samples"), "samples"))
    weights = [_int(w, "weight") for w in _list(prof.get("weights"), "weights")]
    if len(stacks) != len(weights):
        raise MalformedDump("samples and weights differ in length")
    side = doc.get(SIDE_KEY, {}).get("pprof") if isinstance(doc.get(SIDE_KEY), dict) else None
    if side is None:
        unit = prof.get("unit") if isinstance(prof.get("unit"), str) else "bytes"
        return Flame((( _LEGACY_SAMPLE_TYPE[0], unit),), stacks, tuple((w,) for w in weights))
    if not isinstance(side, dict):
        raise MalformedDump(f"{SIDE_KEY}.pprof: expected an object")
    types = _pairs(side.get("sample_types"), "sample_types")
    if not types:
        raise MalformedDump("sample_types: expected at least one")
    more = side.get("more_values")
    if not isinstance(more, list) or len(more) != len(weights):
        raise MalformedDump("more_values: expected one row per sample")
    values = tuple((w, *(_int(x, "value") for x in _list(row, "more_values row"))) for w, row in zip(weights, more))
    if any(len(v) != len(types) for v in values):
        raise MalformedDump(f"more_values: each row needs {len(types) - 1} values")
    lines = side.get("frame_lines") or {}
    if not isinstance(lines, dict):
        raise MalformedDump("frame_lines: expected an object")
    frame_lines = {}
    for k, v in lines.items():
        if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)):
            raise MalformedDump("frame_lines: expected [file, line] values")
        frame_lines[k] = (v[0], _int(v[1], "line"))
    comments = side.get("comments") or []
    if not isinstance(comments, list) or not all(isinstance(c, str) for c in comments):
        raise MalformedDump("comments: expected a list of strings")
    return Flame(types, stacks, values, frame_lines, _pairs(side.get("labels") or [], "labels"),
                 _int(side.get("time_nanos", 0), "time_nanos"), _int(side.get("duration_nanos", 0), "duration_nanos"),
                 _pairs([side.get("period_type") or list(_LEGACY_SAMPLE_TYPE)], "period_type")[0], tuple(comments))
