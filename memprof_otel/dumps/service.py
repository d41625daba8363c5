"""Dumps on demand: deep-capture a live model's next forwards and store a speedscope file.

Used by ``POST /v1/dumps``, the watchdog's ``dump`` action and the OOM flight recorder. The
capture itself lives in ``capture.py`` and the file format in ``speedscope.py``; this module only
picks the model, waits under a deadline, stores the result with rotation and counts the outcome in
``memprof_dumps_total{format,result}``. ``submit`` does the same without making its caller wait:
the request is checked and the capture armed at once, the wait and the save run in a worker
thread, and the job (``jobs.py``) says how it ended. It knows models only through what the
composition root hands it (the live handles, the dumps config, the service name, the counter), so
it imports nothing above it.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from .._log import rate_limited
from ..config import DumpsConfig
from ..errors import (CaptureBusy, CaptureTimeout, ExportError, InstrumentationError, MemprofError,
                      ModelRequired, UnknownModel)
from .capture import Capture
from .jobs import DumpJob, DumpJobs, ShuttingDown
from .store import DumpInfo, DumpStore, default_dir


class Capturable(Protocol):
    """An instrumented model as the dump service sees it (``Instrumentation`` is one)."""

    name: str

    def capture(self, forwards: int = 1) -> Capture: ...


def pick_model(live: Mapping[str, Capturable], name: str | None) -> Capturable:
    if name:
        h = live.get(name)
        if h is None:
            known = ", ".join(sorted(live)) or "none"
            raise UnknownModel(f"no instrumented model named {name!r} (instrumented: {known})")
        return h
    if not live:
        raise UnknownModel("no model is instrumented in this process")
    if len(live) > 1:
        raise ModelRequired(f"several models are instrumented ({', '.join(sorted(live))}); pass model=NAME")
    return next(iter(live.values()))


class DumpService:
    """``live``: name -> handle of the models instrumented now; ``config``: the dumps section in
    force (None before the first start); ``count_dump(format, result)``: the dumps counter;
    ``service_name``: the service name in force (it names the default folder)."""

    def __init__(self, live: Callable[[], Mapping[str, Capturable]],
                 config: Callable[[], DumpsConfig | None], count_dump: Callable[[str, str], None],
                 service_name: Callable[[], str] = lambda: "memprof-otel") -> None:
        self._live = live
        self._config = config
        self._count = count_dump
        self._service_name = service_name
        self._store: DumpStore | None = None
        self._store_key: tuple[Any, ...] | None = None
        self._lock = threading.Lock()
        self.related: dict[str, DumpInfo] = {}  # speedscope dump id -> its CUDA history snapshot
        self.jobs = DumpJobs()
        self._pending: dict[str, tuple[DumpJob, Capture]] = {}  # job id -> it and its armed capture, while it runs

    @property
    def dir(self) -> Path:
        """The folder dumps go to: ``dumps.dir``, else this process's own (``default_dir``; the pid
        is read each time, so a forked worker gets its own folder too)."""
        d = self._config() or DumpsConfig()
        return Path(d.dir) if d.dir else default_dir(self._service_name(), os.getpid())

    @property
    def store(self) -> DumpStore:
        """The store in force: the public way to save, list and read dumps of this process
        (``store.save(doc, kind=..., model=...)``, ``store.list()``, ``store.read(id)``)."""
        d = self._config() or DumpsConfig()
        folder = self.dir
        key = (folder, d.max_files, d.max_bytes, d.max_oom_files)
        with self._lock:
            if self._store is None or self._store_key != key:
                store = DumpStore(folder, d.max_files, d.max_bytes, max_oom_files=d.max_oom_files,
                                  private=not d.dir)  # the default folder's name is predictable
                self._store, self._store_key = store, key
            return self._store

    def pick_model(self, name: str | None) -> Capturable:
        return pick_model(self._live(), name)

    def capture(self, model: str | None, forwards: int = 1, timeout: float = 30.0,
                reason: str = "api") -> DumpInfo:
        """Capture the next ``forwards`` forwards of ``model`` and store the speedscope file.
        Raises UnknownModel, CaptureBusy, CaptureTimeout, ExportError (all counted)."""
        h, cap = self._arm(model, forwards)
        return self._finish(h, cap, forwards, timeout, reason)

    def submit(self, model: str | None, forwards: int = 1, timeout: float = 30.0,
               reason: str = "api") -> DumpJob:
        """``capture`` without the wait: returns the pending job at once, after the checks that
        need no forward (UnknownModel, CaptureBusy, InstrumentationError are raised here). The
        rest runs in a worker thread and ends in ``job.complete`` or ``job.fail``, never raises."""
        h, cap = self._arm(model, forwards)
        job = DumpJob(h.name, forwards, timeout)
        self.jobs.add(job)
        with self._lock:
            self._pending[job.id] = (job, cap)
        worker = threading.Thread(target=self._run_job, args=(job, h, cap, timeout, reason),
                                  name=f"memprof-dump-{job.id}", daemon=True)
        try:
            worker.start()
        except RuntimeError as e:  # no thread to be had: the capture must not stay armed
            cap.cancel()
            job.fail(e)
            raise
        return job

    def _run_job(self, job: DumpJob, h: Capturable, cap: Capture, timeout: float, reason: str) -> None:
        try:
            info = self._finish(h, cap, job.forwards, timeout, reason)
        except BaseException as e:  # a worker thread: whatever happens is the job's answer
            cap.cancel()
            job.fail(e)
        else:
            with self._lock:
                related = self.related.get(info.id)
            job.complete(info, related)
        with self._lock:
            self._pending.pop(job.id, None)
        self.jobs.evict()

    def end_pending(self) -> int:
        """End every request still waiting for its forwards: each fails as ``shutting_down`` at once
        (a caller long-polling it gets its answer now, not at its ``wait``). Their count."""
        with self._lock:
            pending = list(self._pending.values())
        for job, cap in pending:
            job.fail(ShuttingDown(f"{job.model!r}: memprof-otel is shutting down"))  # first: the job's answer
            cap.cancel("memprof-otel is shutting down")  # then its worker wakes, and its own fail is a no-op
        return len(pending)

    def _arm(self, model: str | None, forwards: int) -> tuple[Capturable, Capture]:
        h = self.pick_model(model)
        try:
            return h, h.capture(forwards)
        except CaptureBusy:
            self._count("speedscope", "busy")
            raise

    def _finish(self, h: Capturable, cap: Capture, forwards: int, timeout: float, reason: str) -> DumpInfo:
        if not cap.wait(timeout):
            cap.cancel()
            self._count("speedscope", "timeout")
            raise CaptureTimeout(f"no forward of {h.name!r} completed within {timeout:g} s "
                                 f"({cap.completed}/{forwards} captured)")
        if cap.failed is not None and cap.completed == 0:
            raise InstrumentationError(f"{h.name!r}: {cap.failed}")
        return self.store_capture(h.name, cap, reason)

    def store_capture(self, model: str, cap: Capture, reason: str) -> DumpInfo:
        try:
            doc = cap.speedscope()
            doc.setdefault("name", f"{model} ({reason})")
            info = self.store.save(doc, kind="speedscope", model=model)
        except (ExportError, OSError, ValueError) as e:
            self._count("speedscope", "error")
            raise ExportError(f"could not store the dump: {e}") from e
        self._count("speedscope", "ok")
        if cap.cuda_snapshot is not None:  # memory_viz's data; `python -m pickle`-able after json.load
            snap = self.store_json(cap.cuda_snapshot, kind="cuda_snapshot", model=model)
            if snap is not None:
                with self._lock:
                    self.related[info.id] = snap
                    while len(self.related) > 1000:
                        self.related.pop(next(iter(self.related)))
        return info

    def store_json(self, doc: dict[str, Any], kind: str, model: str) -> DumpInfo | None:
        """Store a non-speedscope dump (e.g. an OOM flight record); errors are counted, not raised."""
        try:
            info = self.store.save(doc, kind=kind, model=model)
        except Exception as e:
            self._count(kind, "error")
            rate_limited.warning(f"dump:{kind}", "memprof_otel: could not store a %s dump: %r", kind, e)
            return None
        self._count(kind, "ok")
        return info

    def capture_all(self, reason: str, forwards: int = 1, timeout: float = 60.0) -> list[DumpInfo]:
        """The watchdog's dump action: capture every live model (errors counted and logged)."""
        out = []
        live = sorted(self._live())
        if not live:
            self._count("speedscope", "no_model")
            rate_limited.warning("dump-all", "memprof_otel: dump for %s skipped: no model is instrumented", reason)
        for name in live:
            try:
                out.append(self.capture(name, forwards, timeout, reason))
            except MemprofError as e:
                rate_limited.warning("dump-all", "memprof_otel: dump of %s for %s failed: %s", name, reason, e)
        return out
