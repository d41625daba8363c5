"""torch's CUDA allocator trace, armed only while attributed forwards run: per-layer figures, per
thread, without reading the allocator at every module boundary (``cuda.attribution: trace``).

Reading ``torch._C._cuda_memoryStats`` at each boundary (about 10-19 us on an H100, plus resetting
the device's one peak register) made an attributed GPT-2 forward cost 2-3x a plain one, and the
shared register made per-layer figures wrong when two threads forwarded on one device. The
allocator's own history (``torch.cuda.memory._record_memory_history`` without stacks) records every
alloc and free with the recording thread's ``user_metadata`` string (``_cuda_setMemoryMetadata``,
thread-local, ~0.3 us a call). So a forward tags its thread with ``<forward tag><boundary index>``
at each boundary and, at its end, takes one snapshot and folds the events that carry its tag
(``attribution/trace_fold.py``): readings shaped like a per-boundary read's, in requested bytes
(what the trace records), per thread, without touching torch's peak counters.

The history ring is process-wide: it is armed (and cleared) when the first traced forward starts
and disarmed when the last one in flight ends, so its snapshot holds only the events since then.
If anything else records history (the application, a deep capture), the trace is not ours to arm or
clear: ``open`` says no and the caller falls back. torch functions are injectable (the tests drive
a scripted allocator double; this machine has no GPU), and torch is imported only on first use.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import SourceUnavailable

__all__ = ["CudaAllocatorTrace", "TraceFns", "TraceTicket", "torch_trace_fns"]

_SKIPPED = ["free_completed", "snapshot"]  # torch's action names (``_record_memory_history``'s skip_actions)


@dataclass(frozen=True)
class TraceFns:
    """The torch calls the trace needs (``torch._C`` names in the comments)."""
    arm: Callable[[int, bool], None]           # _cuda_record_memory_history("all", None, ...) (max_entries, clear)
    disarm: Callable[[], None]                 # _cuda_record_memory_history(None, ...)
    snapshot: Callable[[], dict[str, Any]]     # _cuda_memorySnapshot
    set_metadata: Callable[[str], None]        # _cuda_setMemoryMetadata (this thread's)
    is_enabled: Callable[[], bool]             # _cuda_isHistoryEnabled


def torch_trace_fns(torch: Any = None) -> TraceFns:
    """The real calls, or ``SourceUnavailable`` with the reason when this torch lacks one of them
    (or has no CUDA): the caller then reads the allocator at every boundary, as before."""
    if torch is None:
        import torch  # why: CUDA internals only when an attributed CUDA forward asks for them
    c = torch._C
    names = ("_cuda_record_memory_history", "_cuda_memorySnapshot", "_cuda_setMemoryMetadata",
             "_cuda_isHistoryEnabled")
    absent = [n for n in names if not callable(getattr(c, n, None))]
    if absent:
        raise SourceUnavailable(f"this torch ({getattr(torch, '__version__', '?')}) has no torch._C."
                                + ", torch._C.".join(absent))
    record = c._cuda_record_memory_history
    snap = c._cuda_memorySnapshot

    def arm(max_entries: int, clear: bool) -> None:
        # enabled="all" (history of every event), context=None (no stacks: the costly part), no
        # compile context, no annotations. Only the actions the fold reads are kept: a block's
        # return to the pool (free_completed) is a third of all events and moves no counter we use,
        # and every entry kept costs in the snapshot and in the fold (measured on an H100)
        record("all", None, "python", max_entries, clear, False, False, _SKIPPED)

    def disarm() -> None:
        record(None, None, "python", 1, True, False, False, [])

    return TraceFns(arm=arm, disarm=disarm, snapshot=lambda: snap(None), set_metadata=c._cuda_setMemoryMetadata,
                    is_enabled=c._cuda_isHistoryEnabled)


class TraceTicket:
    """One forward's share of the trace: its tag and when it started (to detect a wrapped ring)."""

    __slots__ = ("tag", "start_us", "closed")

    def __init__(self, tag: str, start_us: int) -> None:
        self.tag = tag
        self.start_us = start_us
        self.closed = False


class TraceLost(Exception):
    """The ring wrapped while the forward ran (its earliest events may be overwritten)."""


class CudaAllocatorTrace:
    """Process-wide owner of torch's allocator history for traced forwards (thread-safe)."""

    def __init__(self, max_entries: int, fns: TraceFns | None = None) -> None:
        if max_entries <= 0:
            raise ValueError("max_entries must be positive")
        self.max_entries = max_entries
        self.fns = fns if fns is not None else torch_trace_fns()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._ids = itertools.count(1)
        self.refused = 0  # forwards that found history recorded by someone else

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def open(self) -> TraceTicket | None:
        """A ticket for one forward, arming the ring if none is in flight; None when history is
        already being recorded by someone else (never ours to clear). Raises what torch raises."""
        with self._lock:
            if self._in_flight == 0:
                if self.fns.is_enabled():
                    self.refused += 1
                    return None
                self.fns.arm(self.max_entries, True)  # cleared: the snapshot holds only from now on
            self._in_flight += 1
            # a tag no other forward of this process ever carries; ':' ends it so that "1:" is
            # never a prefix of "11:"'s boundaries
            return TraceTicket(f"m{next(self._ids)}:", time.time_ns() // 1000)

    def events(self, ticket: TraceTicket, device_index: int) -> Sequence[dict[str, Any]]:
        """This device's trace since the ring was armed. Raises ``TraceLost`` when the ring is
        full and its oldest event is not older than the forward (it may have lost the forward's
        first events); the caller then drops the forward's figures."""
        traces = self.fns.snapshot().get("device_traces") or []
        trace = traces[device_index] if device_index < len(traces) else []
        if len(trace) >= self.max_entries and trace and trace[0].get("time_us", 0) >= ticket.start_us:
            raise TraceLost(f"the allocator trace ring ({self.max_entries} entries) wrapped during the forward")
        return trace

    def close(self, ticket: TraceTicket) -> None:
        """End the forward's share (idempotent); the last one out disarms the ring."""
        with self._lock:
            if ticket.closed:
                return
            ticket.closed = True
            self._in_flight -= 1
            if self._in_flight == 0:
                self.fns.disarm()
