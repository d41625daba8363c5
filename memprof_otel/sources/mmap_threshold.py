"""glibc's mmap threshold, fixed so that what the kernel counts of a CPU forward is its tensors.

glibc serves an allocation at or over its *mmap threshold* with a fresh mapping, unmapped at free;
smaller ones come from the heap, whose freed pages stay resident. By default the threshold is
*dynamic*: each freed mapping of up to 32 MiB raises it to that size, so after a few forwards every
tensor under 32 MiB comes from the heap. A larger batch then needs larger blocks than the holes its
predecessors left, the heap grows past them, and the process's resident memory rises more than its
tensors: measured on a BERT-shaped encoder (4 layers, 256 wide, eager attention) after mixed traffic
at batch 1-4, the first forward at batch 32 x 512 raised the resident high-water mark 432 MiB for
352 MiB of tensors (1.23x; 1.18x at batch 43), and the heap kept 144 MiB resident after it. The
same forwards with the threshold fixed at 1 MiB: 352.0 MiB for 352.0 MiB, 472.9 for 473.0, nothing
kept. No estimate made from small forwards can follow the heap's history; fixing the threshold
takes the history away, which is what a capacity answer under a memory limit needs.

``mallopt(M_MMAP_THRESHOLD)`` fixes it (and turns off the dynamic adjustment, the trim threshold's
included). It is process-wide and cannot be undone, so it is applied once, where a memory limit is in
force (``capacity.mmap_threshold: auto``) or where the configuration asks for it. Where the
environment already fixed it (``MALLOC_MMAP_THRESHOLD_``, ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold``)
it is left as the environment set it; where malloc is not glibc's (jemalloc, tcmalloc) nothing is
done and the state says so. The cost is a page fault per page of each block over the threshold
(glibc's heap reused them): ``benchmarks/mmap_threshold_cost.py``.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
from typing import Any, Mapping, NamedTuple

import psutil

from .cgroup import find_dirs, memory_limit
from .glibc import HostAllocatorSource

log = logging.getLogger("memprof_otel")

M_MMAP_THRESHOLD = -3  # <malloc.h>
DEFAULT_BYTES = 1 << 20
MAX_BYTES = 32 << 20  # glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)
ENV_VAR = "MALLOC_MMAP_THRESHOLD_"
TUNABLE = "glibc.malloc.mmap_threshold"


class ThresholdState(NamedTuple):
    """Whether glibc's mmap threshold is fixed in this process: ``bytes`` (None: dynamic or not
    glibc), ``by`` (``memprof-otel``, ``environment`` or None) and ``reason`` (why not, or None)."""
    bytes: int | None
    by: str | None
    reason: str | None

    @property
    def fixed(self) -> bool:
        return self.bytes is not None

    def to_dict(self) -> dict[str, Any]:
        return {"mmap_threshold_bytes": self.bytes, "set_by": self.by, "reason": self.reason}


def from_environment(environ: Mapping[str, str]) -> int | None:
    """The threshold the environment fixed for glibc at start (None: it did not)."""
    raw = environ.get(ENV_VAR)
    if raw is None:
        for item in environ.get("GLIBC_TUNABLES", "").replace(":", " ").split():
            name, _, value = item.partition("=")
            if name == TUNABLE:
                raw = value
    if raw is None:
        return None
    raw = raw.strip()
    try:
        return int(raw, 0)
    except ValueError:
        return None


def decide(setting: str | int, limit_in_force: bool) -> int | None:
    """Pure: the threshold to apply for a ``capacity.mmap_threshold`` setting (``auto``, ``off`` or
    bytes), None for none. ``auto`` applies the default where a memory limit is in force."""
    if setting == "off":
        return None
    if setting == "auto":
        return DEFAULT_BYTES if limit_in_force else None
    return int(setting)


_lock = threading.Lock()
_NOT_YET = ThresholdState(None, None, "not applied: no instrumented model has started monitoring yet")
_state = _NOT_YET


def state() -> ThresholdState:
    return _state


def apply(setting: str | int, limit_in_force: bool, environ: Mapping[str, str], backend: str,
          libc: Any = None) -> ThresholdState:
    """Fix the threshold once per process as ``setting`` says (later calls keep the first answer
    that fixed it). ``backend``: which malloc is in use (``glibc`` or another); ``libc`` a stand-in
    in tests. Never raises: a failure is the state's reason."""
    global _state
    with _lock:
        if _state.fixed:
            return _state
        env = from_environment(environ)
        if env is not None:
            _state = ThresholdState(env, "environment", None)
            return _state
        want = decide(setting, limit_in_force)
        if want is None:
            why = ("capacity.mmap_threshold is off" if setting == "off" else
                   "no memory limit is in force (capacity.mmap_threshold: auto)")
            _state = ThresholdState(None, None, f"glibc's dynamic mmap threshold is kept: {why}")
            return _state
        if backend != "glibc":
            _state = ThresholdState(None, None, f"malloc is {backend}, not glibc: its own policy applies")
            return _state
        try:
            if libc is None:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            ok = libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(want))
        except (OSError, AttributeError) as e:
            _state = ThresholdState(None, None, f"mallopt is not available: {e}")
            return _state
        if ok != 1:
            _state = ThresholdState(None, None, f"mallopt(M_MMAP_THRESHOLD, {want}) was refused")
            return _state
        _state = ThresholdState(want, "memprof-otel", None)
        log.info("memprof-otel: glibc's mmap threshold fixed at %d bytes (capacity.mmap_threshold), so a "
                 "forward's resident memory follows its tensors under the memory limit", want)
        return _state


def memory_limit_in_force(configured_limit: int | None) -> bool:
    """A limit the kernel or the configuration enforces on this process's memory: a memory
    cgroup's below the machine's memory, or ``capacity.limit_bytes``."""
    if configured_limit is not None:
        return True
    try:
        limit = memory_limit(find_dirs().memory)[1]
        return limit is not None and limit < psutil.virtual_memory().total
    except Exception:  # an unreadable hierarchy is no limit known
        return False


def apply_configured(setting: str | int, configured_limit: int | None) -> ThresholdState:
    """``apply`` with this process's facts: its environment, its malloc, the limit in force. Never
    raises: monitoring starts whatever happens here."""
    global _state
    if _state.fixed:
        return _state
    try:
        backend = HostAllocatorSource.probe().backend
        return apply(setting, memory_limit_in_force(configured_limit), os.environ, backend)
    except Exception as e:  # a probe that failed: glibc's own policy stays, and the state says why
        with _lock:
            _state = ThresholdState(None, None, f"not applied: {type(e).__name__}: {e}")
        return _state


def reset_for_tests() -> None:
    """Forget the state (the process's malloc keeps what was applied)."""
    global _state
    with _lock:
        _state = _NOT_YET


__all__ = ["DEFAULT_BYTES", "MAX_BYTES", "ThresholdState", "apply", "apply_configured", "decide", "from_environment",
           "memory_limit_in_force", "state"]
