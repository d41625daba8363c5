"""Python-heap growth between two tracemalloc snapshots: the top allocation sites and a speedscope file.

Pure: the functions here take ``tracemalloc.Snapshot`` objects (or the sites made from them) and
never start, stop or snapshot tracing themselves; ``heap_session.py`` does that. A *site* is one
distinct traceback (``compare_to(..., "traceback")``); its allocating frame is the traceback's most
recent one, shown as ``file:line``.

Allocations whose allocating frame is in tracemalloc itself (the first snapshot's own lists) or in
the import machinery are left out, and so are memprof-otel's own (``OwnCode``): walking a traceback
from the allocating frame to older ones, past the standard library, installed packages and
generated code (``<string>``), the first frame met is ours — its sampler thread waiting on an ``Event``, the OTel SDK building its span, its
buffers — unless that frame is one of ours that calls the application (an ``operation`` decorator's
wrapper, a user's callback): then what it allocated below is the application's. A traceback of
library frames alone, cut by the frame limit, cannot be told apart and is kept.
"""
from __future__ import annotations

import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .flame import SIDE_KEY, Flame
from .speedscope import build_speedscope

MAX_SPEEDSCOPE_SITES = 5000   # sites in the flame graph; a process with more growing tracebacks keeps the largest
AT_LIMIT_FRAME = "<frame limit: older frames not traced>"
_ALWAYS_EXCLUDED = (tracemalloc.__file__, "<frozen importlib._bootstrap>",
                    "<frozen importlib._bootstrap_external>", "<unknown>")


@dataclass(frozen=True)
class HeapSite:
    """One traceback whose live Python memory changed between the snapshots."""

    traceback: tuple[tuple[str, int], ...]   # (file, line), oldest first; the last is the allocating frame
    size_diff: int        # bytes: live at the second snapshot minus live at the first
    count_diff: int       # live blocks, likewise
    size: int             # bytes live at the second snapshot
    count: int            # blocks live at the second snapshot
    at_limit: bool        # as many frames as the traceback limit: older frames may not have been traced

    @property
    def file(self) -> str:
        return self.traceback[-1][0] if self.traceback else "<unknown>"

    @property
    def line(self) -> int:
        return self.traceback[-1][1] if self.traceback else 0

    @property
    def site(self) -> str:
        return f"{self.file}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        return {"site": self.site, "file": self.file, "line": self.line, "size_diff_bytes": self.size_diff,
                "count_diff": self.count_diff, "size_bytes": self.size, "count": self.count,
                "traceback": [{"file": f, "line": n} for f, n in self.traceback],
                "traceback_at_limit": self.at_limit}


@dataclass(frozen=True)
class HeapDiff:
    """What grew: ``sites`` are the top growing tracebacks, largest growth first; the totals cover
    every traceback, not only the top ones."""

    sites: tuple[HeapSite, ...]
    growing: tuple[HeapSite, ...]   # every traceback that grew (up to MAX_SPEEDSCOPE_SITES), largest first
    growth_bytes: int          # sum of the positive size differences
    net_bytes: int             # sum of all size differences (growth minus what was freed)
    traced_bytes_before: int   # live traced bytes in the first snapshot, after the exclusions
    traced_bytes_after: int
    sites_grown: int           # tracebacks whose live size grew

    def to_dict(self) -> dict[str, Any]:
        return {"growth_bytes": self.growth_bytes, "net_bytes": self.net_bytes,
                "traced_bytes_before": self.traced_bytes_before, "traced_bytes_after": self.traced_bytes_after,
                "sites_grown": self.sites_grown, "sites": [s.to_dict() for s in self.sites]}


@dataclass(frozen=True)
class OwnCode:
    """Where memprof-otel's code is, where libraries are, and which of our lines call the application.

    ``package`` and ``libraries``: path prefixes (ending in the path separator); ours is checked
    first, as an installed memprof-otel lies inside site-packages. ``callouts``: ``(file, line)``."""

    package: tuple[str, ...]
    libraries: tuple[str, ...]
    callouts: frozenset[tuple[str, int]] = frozenset()

    def owns(self, traceback: Sequence[tuple[str, int]]) -> bool:
        """True when the allocation of ``traceback`` (oldest frame first) is memprof-otel's own."""
        for i, (file, line) in enumerate(reversed(traceback)):
            if file.startswith(self.package):
                return i == 0 or (file, line) not in self.callouts
            # "<string>", "<frozen ...>": code made at run time (a dataclass's __init__, exec) or
            # frozen in the interpreter; like a library frame, it tells nothing of whose it is
            if not (file.startswith(self.libraries) or file.startswith("<")):
                return False  # the application's frame
        return False  # library frames only: whose they are was cut off, keep them


def exclusion_filters() -> list[tracemalloc.Filter]:
    """Filters that drop traces whose allocating frame is in tracemalloc or the import machinery."""
    return [tracemalloc.Filter(False, p) for p in _ALWAYS_EXCLUDED]


def _site(d: tracemalloc.StatisticDiff, limit: int) -> HeapSite:
    # grouping by traceback keeps no per-trace frame total, so reaching the limit is what we can tell
    tb = tuple((f.filename, f.lineno) for f in d.traceback)
    return HeapSite(tb, d.size_diff, d.count_diff, d.size, d.count, len(tb) >= limit)


def diff_snapshots(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, *, top: int,
                   own: OwnCode | None = None) -> HeapDiff:
    """The ``top`` tracebacks whose live size grew most from ``before`` to ``after`` (both taken
    with the same traceback limit), after dropping tracemalloc's and the import machinery's
    allocations and, given ``own``, memprof-otel's."""
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    filters = exclusion_filters()
    before, after = before.filter_traces(filters), after.filter_traces(filters)
    # one entry per traceback found in either snapshot (size 0 in `after` when all of it was freed)
    diffs = after.compare_to(before, "traceback")
    if own is not None:
        diffs = [d for d in diffs if not own.owns([(f.filename, f.lineno) for f in d.traceback])]
    grown = sorted((d for d in diffs if d.size_diff > 0), key=lambda d: (-d.size_diff, -d.count_diff))
    growing = tuple(_site(d, after.traceback_limit) for d in grown[:MAX_SPEEDSCOPE_SITES])
    return HeapDiff(
        sites=growing[:top], growing=growing,
        growth_bytes=sum(d.size_diff for d in grown), net_bytes=sum(d.size_diff for d in diffs),
        traced_bytes_before=sum(d.size - d.size_diff for d in diffs),
        traced_bytes_after=sum(d.size for d in diffs), sites_grown=len(grown))


def heap_flame(diff: HeapDiff, *, started_unix: float = 0.0, seconds: float = 0.0) -> Flame:
    """The growth as plain flame data: each growing traceback a stack (oldest frame at the root,
    the allocating ``file:line`` at the leaf; a traceback at the frame limit starts with a frame
    saying older frames may be missing) with its bytes and blocks grown; each ``file:line`` frame
    keeps its file and line for pprof. ``started_unix``: the first snapshot's time; ``seconds``:
    the time between the snapshots."""
    rows: dict[tuple[str, ...], list[int]] = {}
    lines: dict[str, tuple[str, int]] = {}
    for s in diff.growing:
        frames = [f"{f}:{n}" for f, n in s.traceback]
        lines.update((f"{f}:{n}", (f, n)) for f, n in s.traceback)
        if s.at_limit:
            frames.insert(0, AT_LIMIT_FRAME)
        v = rows.setdefault(tuple(frames), [0, 0])  # distinct tracebacks give distinct stacks
        v[0] += s.size_diff
        v[1] += s.count_diff
    return Flame((("inuse_space", "bytes"), ("inuse_objects", "count")), tuple(rows),
                 tuple((b, c) for b, c in rows.values()), frame_lines=lines,
                 time_nanos=int(started_unix * 1e9), duration_nanos=int(seconds * 1e9),
                 comments=("Python heap growth between two tracemalloc snapshots",))


def heap_speedscope(diff: HeapDiff, name: str, *, started_unix: float = 0.0, seconds: float = 0.0) -> dict[str, Any]:
    """A speedscope file of the growth (``heap_flame``): one ``sampled`` profile in bytes, each
    growing traceback a stack weighted by its growth; what its pprof file needs beyond it rides
    under ``memprof_otel``."""
    flame = heap_flame(diff, started_unix=started_unix, seconds=seconds)
    doc = build_speedscope(name, flame.weighted(), [], exporter="memprof-otel heap diff", measure="bytes grown")
    doc[SIDE_KEY] = {"pprof": flame.side_entry()}
    return doc
