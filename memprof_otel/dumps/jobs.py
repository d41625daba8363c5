"""Dump requests in flight: the bounded table behind ``POST /v1/dumps`` (202) and its polling.

A request is answered at once with a job; the capture waits for its forwards in a worker thread
and the job ends ``complete`` (with the stored dump) or ``failed`` (with an error code and text).
Job ids (``job-`` and 16 hex digits) never look like dump ids, so ``GET /v1/dumps/{id}`` tells a
job's status from a stored file's download by the id alone. No I/O here: the table, the states
and their JSON form.
"""
from __future__ import annotations

import re
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any

from ..errors import CaptureBusy, CaptureTimeout, CaptureUnsupported, ExportError, InstrumentationError, UnknownModel
from .store import DumpInfo

JOB_ID_RE = re.compile(r"job-[0-9a-f]{16}")
PENDING, COMPLETE, FAILED = "pending", "complete", "failed"
MAX_JOBS = 256  # finished jobs kept for polling; the oldest finished one goes first

class ShuttingDown(InstrumentationError):
    """A pending request ended because monitoring is shutting down (``mp.shutdown()``)."""


# exception -> the error code a failed job reports (the HTTP layer maps codes to statuses)
_ERROR_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (ShuttingDown, "shutting_down"), (CaptureTimeout, "no_forward_in_time"), (CaptureBusy, "capture_in_progress"),
    (UnknownModel, "unknown_model"), (CaptureUnsupported, "capture_unsupported"),
    (InstrumentationError, "uninstrumented"),
    (ExportError, "dump_not_stored"),
)


def error_code(exc: BaseException) -> str:
    for kind, code in _ERROR_CODES:
        if isinstance(exc, kind):
            return code
    return "internal"


def new_job_id() -> str:
    return f"job-{secrets.token_hex(8)}"


class DumpJob:
    """One dump request. ``status`` goes ``pending`` -> ``complete`` | ``failed``, once."""

    def __init__(self, model: str, forwards: int, timeout: float, job_id: str | None = None,
                 created: float | None = None) -> None:
        self.id = job_id or new_job_id()
        self.model = model
        self.forwards = forwards
        self.timeout = timeout
        self.created = time.time() if created is None else created
        self.status = PENDING
        self.finished: float | None = None
        self.dump: DumpInfo | None = None
        self.related: DumpInfo | None = None  # the CUDA allocator history of the same window
        self.error: str | None = None
        self.detail: str | None = None
        self._done = threading.Event()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None) -> bool:
        """True once the job has finished; False if ``timeout`` seconds passed first."""
        return self._done.wait(timeout)

    # complete() and fail() set their fields before ``status``: a reader that sees the final status
    # sees them too (``to_dict`` from another thread reads ``status`` first)
    def complete(self, dump: DumpInfo, related: DumpInfo | None = None) -> None:
        if self._done.is_set():
            return
        self.dump, self.related, self.finished = dump, related, time.time()
        self.status = COMPLETE
        self._done.set()

    def fail(self, exc: BaseException) -> None:
        if self._done.is_set():
            return
        self.error = error_code(exc)
        self.detail = (str(exc) or type(exc).__name__)[:2000]
        self.finished = time.time()
        self.status = FAILED
        self._done.set()

    def to_dict(self, base_url: str = "") -> dict[str, Any]:
        """JSON form for ``POST /v1/dumps`` and ``GET /v1/dumps/{job id}``: ``dump`` (with the
        download ``url``) when complete, ``error`` and ``detail`` when failed, null otherwise."""
        status = self.status  # first: the fields of a final status are set before it
        dump = None
        if status != PENDING and self.dump is not None:
            dump = self.dump.to_dict(base_url)
            if self.related is not None:
                dump["cuda_snapshot"] = self.related.to_dict(base_url)
        final = status != PENDING
        return {"id": self.id, "status": status, "model": self.model, "forwards": self.forwards,
                "timeout": self.timeout, "created": self.created, "finished": self.finished if final else None,
                "url": f"{base_url}/v1/dumps/{self.id}", "dump": dump,
                "error": self.error if final else None, "detail": self.detail if final else None}


class DumpJobs:
    """The recent jobs by id: every pending job (at most one per model: a second capture of a model
    is refused while one runs) and up to ``max_finished`` finished ones, oldest evicted first."""

    def __init__(self, max_finished: int = MAX_JOBS) -> None:
        if max_finished < 1:
            raise ValueError(f"max_finished must be >= 1, got {max_finished}")
        self.max_finished = max_finished
        self._lock = threading.Lock()
        self._jobs: OrderedDict[str, DumpJob] = OrderedDict()

    def add(self, job: DumpJob) -> None:
        with self._lock:
            self._jobs[job.id] = job
            self._evict()

    def get(self, job_id: str) -> DumpJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)

    def evict(self) -> None:
        """Drop the oldest finished jobs past the cap (called after a job finishes)."""
        with self._lock:
            self._evict()

    def _evict(self) -> None:
        finished = [j for j in self._jobs.values() if j.done]
        for job in finished[:max(0, len(finished) - self.max_finished)]:
            del self._jobs[job.id]
