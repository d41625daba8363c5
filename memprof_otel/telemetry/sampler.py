"""The background sampler: one named daemon thread reading every source on an interval.

Each source is read on its own worker thread, so a source that hangs (an NVML call stuck in the
driver, a /proc read on a wedged mount) costs a counted timeout, not the whole tick; a source that
raises or returns garbage (negative, NaN, wrong type) is counted and skipped for that tick. The
latest good figures land in a bounded ring buffer of ``Sample``s that exporters read at scrape time
(a scrape never reads a device). Listeners (operations, watchdog) run after each tick; their
errors are counted too. After ``fork`` the child has no threads: the sampler re-arms itself there.
"""
from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Mapping

from .._log import rate_limited
from ..timeline import GpuReading, Sample

ReadFn = Callable[[], Any]
Listener = Callable[[Sample], None]


class GarbageReading(ValueError):
    """A source answered with something that is not a set of finite, non-negative figures."""


def check_figures(value: Any, source: str) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise GarbageReading(f"{source}: expected a mapping of figures, got {type(value).__name__}")
    out: dict[str, float] = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise GarbageReading(f"{source}: figure {k!r} is {v!r}")
        out[str(k)] = v
    return out


def check_gpus(value: Any, source: str) -> tuple[GpuReading, ...]:
    if not isinstance(value, (tuple, list)) or not all(isinstance(g, GpuReading) for g in value):
        raise GarbageReading(f"{source}: expected GPU readings, got {type(value).__name__}")
    for g in value:
        if g.used_bytes < 0 or g.total_bytes < 0 or (g.process_used_bytes or 0) < 0:
            raise GarbageReading(f"{source}: negative memory figure on GPU {g.index}")
    return tuple(value)


class _Worker:
    """One source's reader thread. ``submit`` never blocks; a reader still busy is reported."""

    def __init__(self, name: str, read: ReadFn) -> None:
        self.name = name
        self.read = read
        self._cv = threading.Condition()
        self._pending = False
        self._busy = False
        self._result: tuple[bool, Any] | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"memprof-source-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                self._pending = False
                self._busy = True
            try:
                out: tuple[bool, Any] = (True, self.read())
            except BaseException as e:  # noqa: BLE001 - a source must never kill its thread
                out = (False, e)
            with self._cv:
                self._busy = False
                self._result = out
                self._cv.notify_all()

    def read_within(self, deadline: float) -> tuple[bool, Any]:
        """(ok, value-or-exception); a timeout or a still-busy reader is a TimeoutError."""
        busy = self.submit()
        return (False, busy) if busy is not None else self.collect(deadline)

    def submit(self) -> TimeoutError | None:
        """Ask for a fresh read without waiting; the error when an earlier read is still running."""
        with self._cv:
            if self._busy or self._pending:
                return TimeoutError(f"{self.name} is still busy with an earlier read")
            self._result = None
            self._pending = True
            self._cv.notify_all()
            return None

    def collect(self, deadline: float) -> tuple[bool, Any]:
        """Wait until ``deadline`` for the read ``submit`` asked for."""
        with self._cv:
            while self._result is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False, TimeoutError(f"{self.name} did not answer within the sampler interval")
                self._cv.wait(left)
            return self._result

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


class SourceSpec:
    """A named read function plus its validator (``check_figures`` or ``check_gpus``)."""

    def __init__(self, name: str, read: ReadFn, check: Callable[[Any, str], Any] = check_figures) -> None:
        self.name = name
        self.read = read
        self.check = check


_samplers: "weakref.WeakSet[Sampler]" = weakref.WeakSet()
_fork_hook = False


def _rearm_after_fork() -> None:
    for s in list(_samplers):
        s._after_fork()


class Sampler:
    """``start()``/``stop(timeout)``; ``latest()``, ``samples(since)`` and per-source health."""

    def __init__(self, sources: list[SourceSpec], interval_s: float = 1.0, buffer_size: int = 3600,
                 current_operation: Callable[[], str | None] = lambda: None,
                 clock: Callable[[], float] = time.time) -> None:
        self.interval_s = interval_s
        self._sources = list(sources)
        self._buffer: deque[Sample] = deque(maxlen=buffer_size)
        self._current_operation = current_operation
        self._clock = clock
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._workers: dict[str, _Worker] = {}
        self.errors: dict[str, int] = {s.name: 0 for s in sources}
        self.up: dict[str, bool] = {s.name: False for s in sources}
        self.last_error: dict[str, str] = {}
        self.last_duration_s = 0.0
        self.last_success_unix = 0.0
        self.ticks = 0
        self.listener_errors = 0

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def start(self) -> None:
        global _fork_hook
        if self.running:
            return
        if not _fork_hook and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_rearm_after_fork)
            _fork_hook = True
        _samplers.add(self)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memprof-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> bool:
        """Stop and join under ``timeout``; True when the thread ended in time."""
        self._stop.set()
        t = self._thread
        ended = True
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
            ended = not t.is_alive()
        for w in self._workers.values():
            w.close()
        self._workers.clear()
        _samplers.discard(self)
        return ended

    def _after_fork(self) -> None:
        # the child inherited our state but not our threads (nor sane locks): rebuild and restart
        was_running = self._thread is not None and not self._stop.is_set()
        self._lock = threading.Lock()
        self._workers = {}
        self._thread = None
        self._buffer.clear()
        if was_running:
            self.start()

    def add_listener(self, fn: Listener) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: Listener) -> None:
        try:
            self._listeners.remove(fn)
        except ValueError:
            pass

    def add_source(self, spec: SourceSpec) -> None:
        with self._lock:
            if any(s.name == spec.name for s in self._sources):
                return
            self._sources.append(spec)
            self.errors.setdefault(spec.name, 0)
            self.up.setdefault(spec.name, False)

    # ---- reading ---------------------------------------------------------------------------
    def _loop(self) -> None:
        stop = self._stop
        next_t = time.monotonic()
        while not stop.is_set():
            self.tick()
            next_t += self.interval_s
            now = time.monotonic()
            if next_t < now:  # fell behind (a slow tick): skip the missed slots, do not burst
                next_t = now + self.interval_s
            stop.wait(next_t - now)

    def tick(self) -> Sample:
        """Read every source once (also callable directly, e.g. at operation boundaries)."""
        t0 = time.monotonic()
        deadline = t0 + max(0.005, self.interval_s * 0.9)
        results: dict[str, Any] = {}
        with self._lock:
            sources = list(self._sources)
        # every read is asked for before any is waited on: a hung source ahead of the others in
        # the list must not use up their share of the deadline
        submitted = []
        for spec in sources:
            w = self._workers.get(spec.name)
            if w is None:
                w = self._workers[spec.name] = _Worker(spec.name, spec.read)
            submitted.append((spec, w, w.submit()))
        for spec, w, busy in submitted:
            ok, value = (False, busy) if busy is not None else w.collect(deadline)
            if ok:
                try:
                    results[spec.name] = spec.check(value, spec.name)
                except GarbageReading as e:
                    ok, value = False, e
            if not ok:
                self._failed(spec.name, value)
            else:
                self.up[spec.name] = True
        process = results.pop("process", {})
        gpus = results.pop("nvml", ())
        container = results.pop("cgroup", {})
        sample = Sample(t=self._clock(), process=process, allocators=results, gpus=gpus,
                        operation=self._safe_operation(), container=container)
        self._buffer.append(sample)
        self.ticks += 1
        self.last_duration_s = time.monotonic() - t0
        if process:
            self.last_success_unix = sample.t
        for fn in list(self._listeners):
            try:
                fn(sample)
            except Exception as e:
                self.listener_errors += 1
                rate_limited.warning("sampler-listener", "memprof_otel: sampler listener %r failed: %r",
                                     fn, e)
        return sample

    def _safe_operation(self) -> str | None:
        try:
            return self._current_operation()
        except Exception:
            return None

    def _failed(self, name: str, err: BaseException) -> None:
        self.errors[name] = self.errors.get(name, 0) + 1
        self.up[name] = False
        self.last_error[name] = f"{type(err).__name__}: {err}"
        rate_limited.warning(f"source:{name}", "memprof_otel: source %s failed: %s (counted; other "
                             "sources unaffected)", name, self.last_error[name])

    def latest(self) -> Sample | None:
        try:
            return self._buffer[-1]
        except IndexError:
            return None

    def seed(self, history: list[Sample]) -> None:
        """Start from an earlier run's samples (a restart with the same settings continues it);
        the ring's bound still holds."""
        self._buffer.extend(history)

    def samples(self, since_unix: float | None = None) -> list[Sample]:
        snap = list(self._buffer)
        if since_unix is None:
            return snap
        return [s for s in snap if s.t >= since_unix]

    def health(self) -> dict[str, Any]:
        return {"running": self.running, "interval_seconds": self.interval_s, "ticks": self.ticks,
                "last_duration_seconds": self.last_duration_s,
                "last_success_unix": self.last_success_unix,
                "sources": {n: {"up": self.up.get(n, False), "errors": self.errors.get(n, 0),
                                "last_error": self.last_error.get(n)} for n in self.errors}}
