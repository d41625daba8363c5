"""CUDA allocator history, recorded only inside a deep-capture window.

``torch.cuda.memory._record_memory_history`` keeps a trace of every allocator event (with stacks):
what ``memory_viz`` draws. Always on it costs too much for production, so a capture turns it on at
its first forward, bounded by ``max_entries``, and off again when it completes or is cancelled,
taking a ``_snapshot()`` first. The two torch functions are injectable: this machine has no GPU,
and the tests drive the recorder through a scripted allocator double.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from .._log import rate_limited, warn_once
from ..errors import SourceUnavailable

RecordFn = Callable[..., None]
SnapshotFn = Callable[..., Any]


def _torch_fns() -> tuple[RecordFn, SnapshotFn]:
    """torch's (private) history calls; a torch without them gives captures without history, said
    once in the log, never an error in a forward."""
    import torch.cuda.memory as cm  # why: CUDA memory internals only when a capture records history

    record, snapshot = getattr(cm, "_record_memory_history", None), getattr(cm, "_snapshot", None)
    if not callable(record) or not callable(snapshot):
        import torch  # why: its version for the message; loaded already (cm above imports it)

        reason = (f"this torch ({torch.__version__}) has no torch.cuda.memory._record_memory_history/"
                  "_snapshot")
        warn_once("cuda-history", "memprof_otel: %s; captures carry no CUDA allocator history", reason)
        raise SourceUnavailable(reason)
    return record, snapshot


class CudaHistoryRecorder:
    def __init__(self, device_index: int, max_entries: int, *, record_fn: RecordFn | None = None,
                 snapshot_fn: SnapshotFn | None = None) -> None:
        if max_entries <= 0:
            raise ValueError("max_entries must be positive")
        self.device_index = device_index
        self.max_entries = max_entries
        if record_fn is None or snapshot_fn is None:
            record_fn, snapshot_fn = _torch_fns()
        self._record, self._snapshot = record_fn, snapshot_fn
        self._lock = threading.Lock()
        self.started = self.stopped = False
        self.error: str | None = None

    def start(self) -> None:
        """Turn recording on (once); a failure is kept in ``error``, never raised into a forward."""
        with self._lock:
            if self.started:
                return
            self.started = True
            try:
                self._record(enabled="all", context="all", stacks="python", max_entries=self.max_entries,
                             device=self.device_index)
            except Exception as e:
                self.error = f"{type(e).__name__}: {e}"
                rate_limited.warning("cuda-history", "memprof_otel: CUDA history not recorded: %s", self.error)

    def stop(self) -> dict[str, Any] | None:
        """Snapshot, then turn recording off (once). The snapshot, or None if none was taken."""
        with self._lock:
            if not self.started or self.stopped or self.error is not None:
                self.stopped = True
                return None
            self.stopped = True
            snap = None
            try:
                snap = self._snapshot(device=self.device_index)
            except Exception as e:
                self.error = f"{type(e).__name__}: {e}"
            try:  # off whatever happened to the snapshot: history must not outlive the window
                self._record(enabled=None, device=self.device_index)
            except Exception as e:
                self.error = self.error or f"{type(e).__name__}: {e}"
            if self.error is not None:
                rate_limited.warning("cuda-history", "memprof_otel: CUDA history snapshot failed: %s", self.error)
            return snap if isinstance(snap, dict) else None
