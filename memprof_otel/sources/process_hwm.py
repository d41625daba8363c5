"""The kernel's own figure of a forward: how far it raised the process's resident memory.

What ends a process over its memory limit is the kernel counting pages, not tensor bytes: a
forward's tensors are a part of what it faults in (allocator rounding, oneDNN scratch, the pages
the heap touches are the rest; measured on a BERT-shaped encoder, the resident rise was ~8 % above
the tensor peak). Linux keeps a per-process resident high-water mark (``VmHWM`` in
``/proc/self/status``) that writing ``5`` to ``/proc/self/clear_refs`` resets to the current
resident size: reset at a forward's start, read at its end, it is the forward's resident peak.

Costs, measured on the 2-core test machine: the write ~1.5 us, a read of ``status`` ~23 us (the
kernel formats the whole file; ``pread`` on a descriptor kept open saves the ~45 us of an
``open`` each time). A mark is two reads and one write: small beside an attributed CPU forward,
whose ledger costs microseconds per op.

The mark is process-wide, so a reading holds only if no other mark was reset meanwhile (a
``generation`` count, checked at the end); the caller also drops readings another forward of its
own overlapped. Resetting the mark would make ``memprof_process_peak_resident_memory_bytes`` (the
process's lifetime peak) forget what came before: each reset first reads the mark and folds it
into ``lifetime_peak()``, which the process source reports instead.

Where ``clear_refs`` cannot be written (not Linux, a kernel without it, a read-only ``/proc``,
another user's process) ``reason()`` says why and ``begin()`` returns None: the memory model then
learns the tensor figure and says so.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import NamedTuple

STALE_S = 600.0  # a forward in flight longer than this is taken as abandoned
_RESET = b"5"  # clear_refs: reset the peak resident set size (Documentation/filesystems/proc.rst)


class Mark(NamedTuple):
    """A forward's start: its resident size, and the reset that began its window."""
    start_rss: int
    generation: int


class Rise(NamedTuple):
    """A forward's figures in resident bytes: the peak above its start, and what it kept."""
    peak_increase: int
    retained: int


def parse_status(text: bytes) -> tuple[int, int] | None:
    """(VmHWM, VmRSS) in bytes from ``/proc/<pid>/status`` (the kernel writes kB); None when absent."""
    hwm = rss = None
    for line in text.split(b"\n"):
        if line.startswith(b"VmHWM:"):
            hwm = _kib(line)
        elif line.startswith(b"VmRSS:"):
            rss = _kib(line)
            break  # VmRSS follows VmHWM
    return (hwm, rss) if hwm is not None and rss is not None else None


def _kib(line: bytes) -> int | None:
    fields = line.split()
    return int(fields[1]) * 1024 if len(fields) > 1 and fields[1].isdigit() else None


class ProcessHighWater:
    """Marks around forwards on the process's resident high-water mark. ``proc`` points it at
    another tree in tests; a real one is ``/proc``. Thread-safe; descriptors are reopened after
    a fork (``/proc/self`` named the parent when they were opened)."""

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._lock = threading.Lock()
        self._pid = -1
        self._status: int | None = None
        self._clear: int | None = None
        self._reason: str | None = None
        self._generation = 0
        self._lifetime = 0
        # generation of a mark in flight -> (its start RSS, when): a mark whose forward never ended
        # (a thread abandoned it) is forgotten after STALE_S, so it cannot skew in_flight_excess
        self._open_starts: dict[int, tuple[int, float]] = {}

    # ---- descriptors -------------------------------------------------------------------------
    def _fds(self) -> tuple[int, int] | None:
        pid = os.getpid()
        if pid == self._pid:
            return (self._status, self._clear) if self._status is not None and self._clear is not None else None
        self._close()
        self._pid = pid
        self._lifetime = 0  # a forked child's peak is its own
        try:
            self._status = os.open(os.path.join(self._proc, "self", "status"), os.O_RDONLY)
            self._read(self._status)  # the peak so far, before the probe below resets it
            self._clear = os.open(os.path.join(self._proc, "self", "clear_refs"), os.O_WRONLY)
            os.write(self._clear, _RESET)  # a kernel without the reset answers EINVAL here, not later
        except OSError as e:
            self._close()
            self._pid = pid
            self._reason = (f"{self._proc}/self/clear_refs cannot reset the resident high-water mark "
                            f"({type(e).__name__}: {e.strerror or e})")
            return None
        self._reason = None
        self._open_starts.clear()
        return self._status, self._clear

    def _close(self) -> None:
        for fd in (self._status, self._clear):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._status = self._clear = None

    def reason(self) -> str | None:
        """Why no mark can be taken here, or None when it can (probes once per process)."""
        with self._lock:
            self._fds()
            return self._reason

    def _read(self, fd: int) -> tuple[int, int] | None:
        figures = parse_status(os.pread(fd, 8192, 0))
        if figures is not None and figures[0] > self._lifetime:
            self._lifetime = figures[0]
        return figures

    # ---- marks -------------------------------------------------------------------------------
    def begin(self) -> Mark | None:
        """Reset the high-water mark to the resident size now; None where that cannot be done."""
        with self._lock:
            fds = self._fds()
            if fds is None:
                return None
            status, clear = fds
            try:
                figures = self._read(status)  # the mark so far, folded into the lifetime peak
                if figures is None:
                    return None
                os.write(clear, _RESET)
            except OSError:
                return None
            self._generation += 1
            self._open_starts[self._generation] = (figures[1], time.monotonic())
            return Mark(figures[1], self._generation)

    def end(self, mark: Mark) -> Rise | None:
        """The forward's rise since ``mark``; None when another mark was reset meanwhile (its
        window then began after this forward's start) or the file could not be read."""
        with self._lock:
            self._open_starts.pop(mark.generation, None)
            fds = self._fds()
            if fds is None:
                return None
            try:
                figures = self._read(fds[0])
            except OSError:
                return None
            if figures is None or mark.generation != self._generation:
                return None
            hwm, rss = figures
            return Rise(max(0, hwm - mark.start_rss), rss - mark.start_rss)

    def discard(self, mark: Mark) -> None:
        """A mark whose forward ends unread (raised, dropped)."""
        with self._lock:
            self._open_starts.pop(mark.generation, None)

    def in_flight_start(self) -> int | None:
        """The smallest resident size at which a marked forward still in flight began (None when
        none is): a caller reads the resident size now only when this is not None."""
        now = time.monotonic()
        with self._lock:
            for gen, (_, at) in list(self._open_starts.items()):
                if now - at > STALE_S:
                    del self._open_starts[gen]
            starts = [rss for rss, _ in self._open_starts.values()]
        return min(starts) if starts else None

    def in_flight_excess(self, rss_now: int) -> int:
        """How far ``rss_now`` lies above the resident size at which the marked forwards in flight
        started (0 when none is): the part of a reading taken mid-forward that is that forward's
        own transient, so a budget can count the level between forwards."""
        start = self.in_flight_start()
        return max(0, rss_now - start) if start is not None else 0

    def lifetime_peak(self) -> int:
        """The largest high-water mark read before any reset: the process's peak resident size so
        far, as far as marks saw it (0 before the first)."""
        with self._lock:
            if self._pid != os.getpid() or self._status is None:
                return 0  # no mark in this process: the kernel's own VmHWM spans its life
            with contextlib.suppress(OSError):
                self._read(self._status)
            return self._lifetime

    @property
    def used(self) -> bool:
        """Has a mark been reset in this process (the kernel's VmHWM then no longer spans its life)?"""
        return self._status is not None and self._clear is not None and self._pid == os.getpid()


_SHARED = ProcessHighWater()


def shared() -> ProcessHighWater:
    """The process's marks: one high-water mark per process, so one object resets it."""
    return _SHARED


__all__ = ["Mark", "ProcessHighWater", "Rise", "parse_status", "shared"]
