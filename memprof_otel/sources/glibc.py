"""The CPU host allocator (glibc malloc) as a memory source, read through ``mallinfo2()``.

``mallinfo2`` walks every free chunk of every arena under the arena locks, so its cost grows with
fragmentation: usually 2-5 us, sometimes hundreds of us, milliseconds on a badly fragmented heap.
The source therefore times each call and backs off (``read_backoff.py``: the wait between real reads
grows with the measured cost, keeping mallinfo2 under ``max_overhead_ratio`` of wall time), and the hot-path
``reading()`` only ever returns the figures of the last real read.

When another allocator replaces malloc (jemalloc, tcmalloc via ``LD_PRELOAD`` or linking), glibc's
arenas are nearly empty and its figures would be silently wrong, so the source refuses to start.
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any, Callable, Mapping, NamedTuple

from memprof_otel.errors import SourceUnavailable
from memprof_otel.sources.base import Reading, ratio
from memprof_otel.sources.read_backoff import ReadBackoff

MALLINFO2_FIELDS: tuple[str, ...] = (
    "arena", "ordblks", "smblks", "hblks", "hblkhd",
    "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
)
DEFAULT_MAPS_PATH = "/proc/self/maps"
# Library basenames that mean malloc is not glibc's; mimalloc is reported as "unknown" because
# the backend() vocabulary is fixed (glibc/jemalloc/tcmalloc/unknown) but it is just as foreign.
_FOREIGN: tuple[tuple[str, str], ...] = (
    ("libjemalloc", "jemalloc"), ("libtcmalloc", "tcmalloc"), ("libmimalloc", "unknown"),
)

MallinfoFn = Callable[[], Any]  # returns a ctypes struct mallinfo2 or a Mapping[str, int]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(field, ctypes.c_size_t) for field in MALLINFO2_FIELDS]


class Probe(NamedTuple):
    """Whether the host-allocator source can run here, which allocator is in use, and why not."""
    available: bool
    backend: str   # "glibc" | "jemalloc" | "tcmalloc" | "unknown"
    reason: str    # "" when available


def figures_from_mallinfo(m: Mapping[str, int], *, allocated_peak: float = 0.0,
                          reserved_peak: float = 0.0) -> dict[str, float]:
    """Allocator figures from one mallinfo2 result. Pure: one result has no history, so the
    peaks are max(now, the peaks passed in); the source keeps that history over its reads.

    ``keepcost`` is the top chunk, which ``malloc_trim`` could hand back to the OS, so only the
    free space *below* it counts as fragmentation (gaps between live chunks).
    """
    arena, hblkhd = int(m["arena"]), int(m["hblkhd"])
    uordblks, fordblks, keepcost = int(m["uordblks"]), int(m["fordblks"]), int(m["keepcost"])
    allocated = uordblks + hblkhd
    reserved = arena + hblkhd
    gaps = max(0, fordblks - keepcost)
    return {
        "allocated_bytes": float(allocated),
        "reserved_bytes": float(reserved),
        "active_bytes": float(allocated),
        "inactive_split_bytes": float(gaps),
        "allocated_peak_bytes": float(max(allocated, allocated_peak)),
        "reserved_peak_bytes": float(max(reserved, reserved_peak)),
        "alloc_retries": 0.0,
        "ooms": 0.0,
        "fragmentation_ratio": ratio(gaps, reserved),
        "cache_free_ratio": ratio(fordblks, reserved),
    }


def _as_mapping(raw: Any) -> Mapping[str, int]:
    if isinstance(raw, Mapping):
        return raw
    return {field: int(getattr(raw, field)) for field in MALLINFO2_FIELDS}


def _load_libc() -> Any | None:
    try:
        # dlopen(NULL): the symbols the process actually resolves, i.e. the libc it runs on.
        return ctypes.CDLL(None)
    except (OSError, TypeError):  # TypeError: Windows has no "main program" handle
        return None


def _lookup_mallinfo2(libc: Any | None) -> MallinfoFn | None:
    fn: MallinfoFn | None = getattr(libc, "mallinfo2", None) if libc is not None else None
    if fn is not None and hasattr(fn, "restype") and hasattr(fn, "argtypes"):
        # A real ctypes symbol: declare that it returns the struct by value.
        fn.restype = _MallInfo2
        fn.argtypes = []
    return fn


def _foreign_allocator(environ: Mapping[str, str], maps_path: str) -> tuple[str, str] | None:
    """(backend, evidence) when a non-glibc malloc is preloaded or mapped, else None."""
    preload = environ.get("LD_PRELOAD", "")
    for lib, name in _FOREIGN:
        if lib in preload:
            return name, f"LD_PRELOAD has {lib}"
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rpartition(" ")[2].strip()
                base = os.path.basename(path)
                for lib, name in _FOREIGN:
                    if base.startswith(lib):
                        return name, f"{path} is mapped"
    except OSError:
        pass  # no maps (not Linux, or hidden): only LD_PRELOAD and the libc lookup can tell
    return None


def _resolve(libc: Any | None, mallinfo2: MallinfoFn | None, maps_path: str,
             environ: Mapping[str, str] | None) -> tuple[Probe, MallinfoFn | None]:
    foreign = _foreign_allocator(os.environ if environ is None else environ, maps_path)
    if foreign is not None:
        name, evidence = foreign
        reason = f"malloc is {name if name != 'unknown' else 'not glibc'} ({evidence}); " \
                 "glibc's mallinfo2 would not see its memory"
        return Probe(False, name, reason), None
    fn = mallinfo2 if mallinfo2 is not None else _lookup_mallinfo2(
        _load_libc() if libc is None else libc)
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        glibc = None
    if fn is None:
        why = f"{glibc} has no mallinfo2 (needs glibc >= 2.33)" if glibc else \
            "the C library has no mallinfo2 (not glibc: musl, macOS, Windows?)"
        return Probe(False, "glibc" if glibc else "unknown", why), None
    return Probe(True, "glibc", ""), fn


def backend(*, libc: Any | None = None, mallinfo2: MallinfoFn | None = None,
            maps_path: str = DEFAULT_MAPS_PATH, environ: Mapping[str, str] | None = None) -> str:
    """Which malloc this process runs on: "glibc", "jemalloc", "tcmalloc" or "unknown"."""
    return _resolve(libc, mallinfo2, maps_path, environ)[0].backend


class HostAllocatorSource:
    """glibc malloc figures for ``device="cpu"``; reads are self-timed and rate-limited.

    ``libc`` (an object with a ``mallinfo2`` attribute), ``mallinfo2`` (a callable, wins over
    ``libc``), ``maps_path``, ``environ`` and ``clock`` are injectable for tests. Construction does
    one real read, so the cached figures always exist.
    """
    name = "cpu"

    def __init__(self, *, libc: Any | None = None, mallinfo2: MallinfoFn | None = None,
                 maps_path: str = DEFAULT_MAPS_PATH, environ: Mapping[str, str] | None = None,
                 min_interval_s: float = 0.01, max_overhead_ratio: float = 0.001,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0: {min_interval_s!r}")
        self._backoff = ReadBackoff(min_interval_s=min_interval_s,
                                    max_overhead_ratio=max_overhead_ratio, clock=clock)
        probe, fn = _resolve(libc, mallinfo2, maps_path, environ)
        if fn is None:
            raise SourceUnavailable(f"host allocator source: {probe.reason}")
        self._fn: MallinfoFn = fn
        # guards the bookkeeping (the back-off's included), never held during mallinfo2
        self._lock = threading.Lock()
        self._in_flight = True
        self._last_read_unix = 0.0  # time.time() at the end of the last real read
        self._skipped = 0
        self._alloc_peak = self._res_peak = 0.0  # since reset_peak()
        self._life_alloc_peak = self._life_res_peak = 0.0
        self._figures: dict[str, float] = {}
        self._reading = Reading(0, 0, 0, 0, 0, 0.0)
        self._read()

    @staticmethod
    def probe(*, libc: Any | None = None, mallinfo2: MallinfoFn | None = None,
              maps_path: str = DEFAULT_MAPS_PATH,
              environ: Mapping[str, str] | None = None) -> Probe:
        """Can the source run here? Never raises; ``reason`` says why not."""
        return _resolve(libc, mallinfo2, maps_path, environ)[0]

    @property
    def min_interval_s(self) -> float:
        """Current wait between real reads: the base, or longer when mallinfo2 has been slow."""
        return self._backoff.min_interval_s

    @property
    def last_read_cost_s(self) -> float:
        """Seconds the last real mallinfo2 call took (``cost_ema_s``: their moving average)."""
        return self._backoff.last_cost_s

    @property
    def cost_ema_s(self) -> float:
        return self._backoff.cost_ema_s

    @property
    def last_read_unix(self) -> float:
        """Unix time of the last real mallinfo2 read: how old the figures every reader gets are."""
        return self._last_read_unix

    @property
    def reads(self) -> int:
        """Real mallinfo2 calls made, construction included."""
        return self._backoff.reads

    @property
    def skipped(self) -> int:
        """Read requests answered from the cache because of the back-off or ``max_cost_s``."""
        return self._skipped

    def read(self, max_cost_s: float | None = None, *, force: bool = False) -> dict[str, float]:
        """Figures, calling mallinfo2 only when the back-off allows it (``force`` overrides).

        With ``max_cost_s`` the read is also skipped while the expected cost (EMA of measured
        costs) exceeds it. Skipped reads, and reads while another thread's is in flight, return
        the cached figures and count in ``skipped``.
        """
        with self._lock:
            too_soon = self._backoff.too_soon()
            too_dear = self._backoff.too_dear(max_cost_s)
            if self._in_flight or (not force and (too_soon or too_dear)):
                self._skipped += 1
                return dict(self._figures)
            self._in_flight = True
        return self._read()

    def maybe_read(self) -> dict[str, float]:
        """``read()`` with the default back-off, for call sites that poll opportunistically."""
        return self.read()

    def refresh(self) -> dict[str, float]:
        """What the sampler calls each tick: a back-off-limited read."""
        return self.read()

    def _read(self) -> dict[str, float]:
        # mallinfo2 runs outside our lock: a 15 ms walk must not stall reset_peak() in a hook.
        try:
            raw, start, end = self._backoff.timed(lambda: _as_mapping(self._fn()))
        except BaseException:
            self._in_flight = False
            raise
        with self._lock:
            self._backoff.record(start, end)
            self._last_read_unix = time.time()
            self._publish(figures_from_mallinfo(raw))
            self._in_flight = False
            return dict(self._figures)

    def _publish(self, figures: dict[str, float]) -> None:
        alloc, res = figures["allocated_bytes"], figures["reserved_bytes"]
        self._alloc_peak = max(self._alloc_peak, alloc)
        self._res_peak = max(self._res_peak, res)
        self._life_alloc_peak = max(self._life_alloc_peak, self._alloc_peak)
        self._life_res_peak = max(self._life_res_peak, self._res_peak)
        # stats() peaks are lifetime maxima (as for CUDA): attribution resets the since-reset
        # peak at every layer boundary, and the exported peak must not drop because of that.
        figures["allocated_peak_bytes"] = self._life_alloc_peak
        figures["reserved_peak_bytes"] = self._life_res_peak
        self._figures = figures
        # One immutable object swapped in whole: reading() needs no lock.
        self._reading = Reading(int(alloc), int(res), int(self._alloc_peak), 0, 0,
                                figures["fragmentation_ratio"], int(self._res_peak))

    def reading(self) -> Reading:
        """The last read's figures. Never calls mallinfo2: safe in per-layer hooks."""
        return self._reading

    def fresh_reading(self, max_age_s: float) -> Reading | None:
        """A read within the back-off, then the figures if that read is at most ``max_age_s``
        old, else None: for callers that compare against a moment (an operation's start), where
        a reading from before it would count what happened earlier as theirs."""
        self.read()
        with self._lock:
            fresh = self._backoff.age_s() <= max_age_s
        return self._reading if fresh else None

    def allocated(self) -> int:
        return self._reading.allocated

    def reserved(self) -> int:
        return self._reading.reserved

    def peak_since_reset(self) -> int:
        """Highest allocated level seen by this source's reads since ``reset_peak()``.

        Reads are sampled, so a transient between two reads is missed: per-layer peaks on CPU
        need an exact ledger; this figure is the allocator's view at sampler resolution.
        """
        return self._reading.peak

    def reset_peak(self) -> None:
        """Restart the since-reset peaks at the last read's levels (no mallinfo2 call)."""
        with self._lock:
            self._alloc_peak = self._figures["allocated_bytes"]
            self._res_peak = self._figures["reserved_bytes"]
            self._publish(dict(self._figures))

    def stats(self) -> dict[str, float]:
        return self.read()


class HeapLevelCounter:
    """The host heap's in-use bytes as a hot counter, for forwards the ledger cannot see into.

    Compiled (inductor) CPU code allocates its buffers without going through the dispatcher, so a
    tensor ledger reads 0 there. mallinfo2's in-use bytes (``uordblks + hblkhd``) do include those
    buffers, along with any other malloc of the process in the meantime, and glibc keeps no peak
    register: a peak between two reads is not seen. So figures from this counter are approximate,
    ``retained`` is the heap's change over the call and the peak is a lower bound.
    """

    def __init__(self, host: HostAllocatorSource) -> None:
        self.host = host

    def read_and_reset(self) -> Reading:
        f = self.host.read(force=True)
        a = int(f["allocated_bytes"])
        return Reading(a, int(f["reserved_bytes"]), a, 0, 0, None, 0)

    def reset_peak(self) -> None:
        return None
