"""Python-heap diffs on demand: a bounded tracemalloc session, one at a time, never left running.

``HeapProfiler.run(seconds, frames, top)`` starts tracemalloc with ``frames`` frames per traceback
(unless the process already traces: then its tracing is reused as it is and never stopped), takes a
snapshot, waits, takes another, stops the tracing it started (in a ``finally``), and hands the two
snapshots to ``heap_diff.py``. The growth is stored as a speedscope file in the dump store and
counted in ``memprof_dumps_total{format="heap",result}``.

Zero cost while off: nothing is traced, nothing runs, until ``run`` is called. A second ``run``
while one waits raises ``CaptureBusy``; ``stop()`` (the runtime's shutdown) ends the wait early, so
tracing stops then too, and the caller still gets the diff of the time that passed.
"""
from __future__ import annotations

import os
import site
import sysconfig
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .._callouts import callout_lines
from .._log import rate_limited
from ..errors import CaptureBusy, ExportError
from .heap_diff import HeapDiff, OwnCode, diff_snapshots, heap_speedscope
from .store import DumpInfo, DumpStore

FORMAT = "heap"         # the dump kind of the stored file and the `format` label of memprof_dumps_total
MAX_SECONDS = 3600.0    # the library's own bound; the HTTP route allows less (guards.HEAP_MAX_SECONDS)
MAX_FRAMES = 1000       # tracemalloc takes up to 65535; more frames cost more on every allocation

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _prefixes(dirs: Iterable[str]) -> tuple[str, ...]:
    out = set()
    for d in dirs:
        if d:
            out.update(os.path.join(p, "") for p in (os.path.abspath(d), os.path.realpath(d)))
    return tuple(sorted(out))


def own_code() -> OwnCode:
    """This process's ``OwnCode``: our package's folder, the standard library's and the installed
    packages' folders, and the lines of ours that call the application (read now: a callout
    defined since the last session counts)."""
    paths = sysconfig.get_paths()
    libraries = [paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    if hasattr(site, "getsitepackages"):  # absent in some embedded and old virtualenv interpreters
        libraries += [*site.getsitepackages(), site.getusersitepackages()]
    return OwnCode(_prefixes([_PACKAGE_DIR]), _prefixes(libraries), callout_lines())


@dataclass(frozen=True)
class HeapResult:
    diff: HeapDiff
    seconds: float            # asked for
    elapsed_seconds: float    # between the two snapshots (less when stopped early)
    frames: int               # frames per traceback that were traced
    tracing_was_on: bool      # the process traced already: its tracing was reused and left on
    stopped_early: bool       # the runtime shut down during the wait
    dump: DumpInfo | None     # the stored speedscope file; None when it could not be stored
    dump_error: str | None

    def to_dict(self, base_url: str = "") -> dict[str, Any]:
        return {"seconds": self.seconds, "elapsed_seconds": round(self.elapsed_seconds, 3), "frames": self.frames,
                "tracing_was_on": self.tracing_was_on, "stopped_early": self.stopped_early,
                **self.diff.to_dict(),
                "dump": self.dump.to_dict(base_url) if self.dump is not None else None,
                "dump_error": self.dump_error}


class HeapProfiler:
    """``store()``: the dump store in force; ``count_dump(format, result)``: the dumps counter;
    ``own``: what counts as memprof-otel's own allocation, left out (``own_code()`` by default; None
    keeps everything)."""

    def __init__(self, store: Callable[[], DumpStore], count_dump: Callable[[str, str], None],
                 own: Callable[[], OwnCode | None] = own_code) -> None:
        self._store = store
        self._count = count_dump
        self._own = own
        self._busy = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()

    @property
    def running(self) -> bool:
        return not self._idle.is_set()

    def run(self, seconds: float, frames: int = 4, top: int = 20) -> HeapResult:
        """Trace for ``seconds``, then return the ``top`` growing sites and the stored speedscope file.
        ``ValueError`` for arguments out of range; ``CaptureBusy`` while another session runs."""
        if not 0 < seconds <= MAX_SECONDS:
            raise ValueError(f"seconds must be in (0, {MAX_SECONDS:g}], got {seconds!r}")
        if not 1 <= frames <= MAX_FRAMES:
            raise ValueError(f"frames must be in 1..{MAX_FRAMES}, got {frames!r}")
        if top < 1:
            raise ValueError(f"top must be >= 1, got {top!r}")
        if not self._busy.acquire(blocking=False):
            self._count(FORMAT, "busy")
            raise CaptureBusy("a Python heap diff is already running in this process; try again when it ends")
        try:
            self._idle.clear()
            self._wake.clear()
            try:
                return self._session(float(seconds), frames, top)
            except Exception:
                self._count(FORMAT, "error")
                raise
        finally:
            self._idle.set()
            self._busy.release()

    def _session(self, seconds: float, frames: int, top: int) -> HeapResult:
        was_on = tracemalloc.is_tracing()
        if not was_on:
            tracemalloc.start(frames)
        try:
            used_frames = tracemalloc.get_traceback_limit()
            started = time.time()
            before = tracemalloc.take_snapshot()
            t0 = time.monotonic()
            stopped = self._wake.wait(seconds)
            after = tracemalloc.take_snapshot()
            elapsed = time.monotonic() - t0
        finally:
            # only the tracing we started; a process that traced keeps tracing. (A start() of the
            # application's own during the wait was a no-op on ours, so it ends with ours.)
            if not was_on:
                tracemalloc.stop()
        diff = diff_snapshots(before, after, top=top, own=self._own())
        del before, after  # the snapshots can be large; the diff keeps what it needs
        doc = heap_speedscope(diff, f"Python heap growth over {elapsed:.1f} s", started_unix=started,
                              seconds=elapsed)
        dump, error = None, None
        try:
            dump = self._store().save(doc, kind=FORMAT, model="")
        except (ExportError, OSError, ValueError) as e:  # the sites still go back to the caller
            error = f"the speedscope file could not be stored: {e}"
            rate_limited.warning("heap-store", "memprof_otel: %s", error)
        self._count(FORMAT, "error" if dump is None else "stopped" if stopped else "ok")
        return HeapResult(diff, seconds, elapsed, used_frames, was_on, stopped, dump, error)

    def stop(self, timeout: float = 2.0) -> bool:
        """End a running session's wait now (its tracing stops, its caller gets what was seen);
        True once no session runs, False if one still runs after ``timeout`` seconds."""
        self._wake.set()
        return self._idle.wait(max(0.0, timeout))
