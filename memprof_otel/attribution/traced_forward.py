"""An attributed CUDA forward that reads nothing at its module boundaries.

At each boundary it only notes the boundary and tags the thread's allocator events with the
boundary's index (``sources/cuda_trace.py``); at the end it takes one snapshot of the allocator
trace, rebuilds the readings a per-boundary read would have given (``attribution/trace_fold.py``)
and replays the boundaries through ``ForwardState``'s own accounting, so per-layer figures and
events are built as by the per-boundary method, at a fraction of its cost — in requested bytes,
which is what the trace records (``trace_fold.py``).
"""
from __future__ import annotations

from typing import Callable

from .peaks import LayerCall
from .trace_fold import boundary_readings
from .forward_state import ForwardState
from ..sources.base import Reading
from ..sources.cuda_trace import CudaAllocatorTrace, TraceTicket


class _TraceMarks:
    """The ``HotCounter`` of a traced forward: each read is a boundary; it tags the thread."""

    __slots__ = ("tag", "count", "_set")

    def __init__(self, tag: str, set_metadata: Callable[[str], None]) -> None:
        self.tag = tag
        self.count = 0
        self._set = set_metadata

    def read_and_reset(self) -> Reading:  # pragma: no cover - never called: the state defers reads
        raise NotImplementedError

    def reset_peak(self) -> None:
        return None

    def mark(self) -> None:
        self._set(self.tag + str(self.count))
        self.count += 1


class TracedForwardState(ForwardState):
    __slots__ = ("trace", "ticket", "device_index", "marks", "boundaries", "base_allocated", "base_reserved")

    def __init__(self, paths: dict[int, str], root_key: int, root_path: str, origin_s: float, baseline: int,
                 on_error: Callable[[str, BaseException], None], record_events: bool, *,
                 trace: CudaAllocatorTrace, ticket: TraceTicket, device_index: int, base: Reading) -> None:
        marks = _TraceMarks(ticket.tag, trace.fns.set_metadata)
        super().__init__(paths, root_key, root_path, marks, origin_s, baseline, on_error, record_events)
        self.trace = trace
        self.ticket = ticket
        self.device_index = device_index
        self.marks = marks
        # (True, path, key, t, False) for an entry, (False, None, key, t, raised) for an exit
        self.boundaries: list[tuple] = []
        self.base_allocated = base.allocated
        self.base_reserved = base.reserved

    # Boundaries are only noted here; ForwardState's accounting runs on them in finish().
    def _enter(self, path: str, key: int, t: float) -> None:
        self.boundaries.append((True, path, key, t, False))
        self.marks.mark()

    def _exit(self, key: int, t: float, raised: bool) -> None:
        self.boundaries.append((False, None, key, t, raised))
        self.marks.mark()

    def finish(self, now_s: float, raised: bool) -> list[LayerCall]:
        try:
            self._exit(self.root_key, now_s, raised)
            self.marks._set("")  # the thread's later allocations are no forward's
            try:
                events = self.trace.events(self.ticket, self.device_index)
            except Exception as e:  # a wrapped ring or a failing snapshot: no figures, counted
                self.lost = f"{type(e).__name__}: {e}"
                return []
        finally:
            self.release()
        readings = iter(boundary_readings(events, self.ticket.tag, len(self.boundaries), self.base_allocated,
                                          self.base_reserved))
        self._read = readings.__next__
        enter, exit_ = ForwardState._enter, ForwardState._exit
        for is_enter, path, key, t, b_raised in self.boundaries:
            if is_enter:
                enter(self, path, key, t)
            else:
                exit_(self, key, t, b_raised)
        self.tracker.clear()
        return self.calls

    def release(self) -> None:
        """Give the trace back (idempotent): also from an attribution aborted before finish."""
        if not self.ticket.closed:
            try:
                self.marks._set("")
            finally:
                self.trace.close(self.ticket)
