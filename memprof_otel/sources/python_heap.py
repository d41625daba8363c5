"""The Python object heap (CPython's pymalloc arenas) as resident bytes, from CPython's own statistics.

Objects up to 512 bytes live in pymalloc's arenas: 1 MiB anonymous mappings of their own, outside
glibc's heap, so neither ``mallinfo2`` nor any tensor figure sees them. ``sys.getallocatedblocks()``
counts blocks, not bytes (block sizes run from 8 to 512 bytes, and pools hold free blocks), so the
bytes come from the arena statistics CPython prints for ``sys._debugmallocstats()``: the same C
function (``_PyObject_DebugMallocStats``) is called through ctypes with a memory stream instead of
stderr, so nothing is written to the process's output.

The figure is the arenas' size less the pools never or no longer used and the bytes lost to arena
alignment (neither is touched, so neither is resident): the pools in use, with their free blocks,
headers and quantization. Pools freed after use stay resident until their arena is freed whole, so
this is a lower bound of what pymalloc holds resident, exact for an arena filled from its start.

The call walks every arena and pool under the GIL (about 0.3 ms for 50 MiB of objects, 0.4 ms for
140 MiB, measured; linear in the arenas), so reads come at most every 5 s and back off beyond that
as glibc's do (``read_backoff.py``): the wait between real reads grows with the measured cost,
keeping it under ``max_overhead_ratio`` of wall time; a read in between returns the last figure and
its time. Where the function or a C stream is missing (another interpreter, a build that does not
export it, ``PYTHONMALLOC=malloc``) the source is down with the reason.
"""
from __future__ import annotations

import ctypes
import re
import threading
import time
from typing import Callable, NamedTuple

from memprof_otel.errors import SourceUnavailable
from memprof_otel.sources.read_backoff import ReadBackoff

StatsTextFn = Callable[[], str]


class PythonHeapReading(NamedTuple):
    resident_bytes: int     # the pools in use (see the module's docstring)
    arena_bytes: int        # every arena's full size (what the arenas map)
    read_at: float          # time.time() of the read the figures come from


_NUMBER = r"=\s*([\d,]+)\s*$"
_ARENAS = re.compile(r"^\d+ arenas \* \d+ bytes/arena\s*" + _NUMBER, re.M)
_UNUSED_POOLS = re.compile(r"^\d+ unused pools \* \d+ bytes\s*" + _NUMBER, re.M)
_ALIGNMENT = re.compile(r"^# bytes lost to arena alignment\s*" + _NUMBER, re.M)


def _number(pattern: re.Pattern[str], text: str) -> int:
    m = pattern.search(text)
    return int(m.group(1).replace(",", "")) if m else 0


def parse_stats(text: str) -> tuple[int, int]:
    """(resident bytes, arena bytes) from ``_PyObject_DebugMallocStats`` text. Pure. A text without
    arena lines (pymalloc off) gives (0, 0); a text that is not the statistics raises ValueError."""
    if "Small block threshold" not in text and "arenas" not in text:
        raise ValueError("not pymalloc statistics")
    arenas = _number(_ARENAS, text)
    unused = _number(_UNUSED_POOLS, text)
    alignment = _number(_ALIGNMENT, text)
    return max(0, arenas - unused - alignment), arenas


def _stats_text_fn() -> StatsTextFn:
    """``_PyObject_DebugMallocStats`` into an ``open_memstream`` stream, as text."""
    fn = getattr(ctypes.pythonapi, "_PyObject_DebugMallocStats", None)
    if fn is None:
        raise SourceUnavailable("python heap: this interpreter exports no _PyObject_DebugMallocStats")
    try:
        libc = ctypes.CDLL(None)
        open_memstream, fclose, free = libc.open_memstream, libc.fclose, libc.free
    except (OSError, AttributeError, TypeError) as e:
        raise SourceUnavailable(f"python heap: no C memory stream (open_memstream): {e}") from e
    open_memstream.restype = ctypes.c_void_p
    open_memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
    fclose.argtypes = [ctypes.c_void_p]
    free.argtypes = [ctypes.c_void_p]
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = ctypes.c_int

    def text() -> str:
        buf, size = ctypes.c_char_p(), ctypes.c_size_t()
        stream = open_memstream(ctypes.byref(buf), ctypes.byref(size))
        if not stream:
            raise OSError("open_memstream failed")
        try:
            fn(stream)  # ctypes.pythonapi holds the GIL: the arenas cannot change meanwhile
        finally:
            fclose(stream)  # flushes: buf and size are valid from here
        try:
            return ctypes.string_at(buf, size.value).decode("ascii", "replace")
        finally:
            free(ctypes.cast(buf, ctypes.c_void_p))

    return text


class PythonHeapSource:
    """``read()`` -> ``PythonHeapReading``, at most as often as its cost allows. ``stats_text`` and
    the clocks are injectable for tests; construction does one real read."""
    name = "python_heap"

    def __init__(self, *, stats_text: StatsTextFn | None = None, min_interval_s: float = 5.0,
                 max_overhead_ratio: float = 0.001, clock: Callable[[], float] = time.perf_counter,
                 wall: Callable[[], float] = time.time) -> None:
        self._backoff = ReadBackoff(min_interval_s=min_interval_s,
                                    max_overhead_ratio=max_overhead_ratio, clock=clock)
        self._text = stats_text if stats_text is not None else _stats_text_fn()
        self._wall = wall
        self._lock = threading.Lock()  # guards the back-off and the reading
        self._reading = PythonHeapReading(0, 0, 0.0)
        try:
            self._read()
        except ValueError as e:
            raise SourceUnavailable(f"python heap: unexpected statistics ({e})") from e

    @property
    def min_interval_s(self) -> float:
        return self._backoff.min_interval_s

    @property
    def cost_ema_s(self) -> float:
        return self._backoff.cost_ema_s

    @property
    def reads(self) -> int:
        """Real reads of the statistics, construction included."""
        return self._backoff.reads

    def read(self) -> PythonHeapReading:
        """A fresh reading when the back-off allows one, else the last (its ``read_at`` says when)."""
        with self._lock:
            if self._backoff.too_soon():
                return self._reading
            self._backoff.hold_off()  # another thread asking meanwhile gets the last one
        return self._read()

    def _read(self) -> PythonHeapReading:
        text, start, end = self._backoff.timed(self._text)
        resident, arenas = parse_stats(text)
        with self._lock:
            self._backoff.record(start, end)
            self._reading = PythonHeapReading(resident, arenas, self._wall())
            return self._reading


__all__ = ["PythonHeapReading", "PythonHeapSource", "parse_stats"]
