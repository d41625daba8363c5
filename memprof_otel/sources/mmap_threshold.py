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
included, which is set here where glibc's dynamic policy would put it: twice the threshold). It is
process-wide and cannot be undone, so it is applied once, when monitoring starts, where a memory
limit is in force (``capacity.mmap_threshold: auto``, the default) or at the size the configuration
gives. ``auto`` scales the threshold to the limit (``scaled_to``: 1/128 of it, 1-32 MiB): a forward
near the limit is made of blocks of a few percent of it, which are then mapped fresh and follow
their tensors, while the blocks of forwards far below it stay in the heap, where they cost nothing.
What each block over the threshold costs is a page fault per page on every forward (glibc's heap
reused them): ``benchmarks/mmap_threshold_cost.py`` and ``benchmarks/pod_overhead.py``. Where the
environment already fixed it (``MALLOC_MMAP_THRESHOLD_``, ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold``)
it is left as the environment set it; where malloc is not glibc's (jemalloc, tcmalloc) nothing is
done and the state says so.
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

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
MIN_BYTES = 1 << 20
MAX_BYTES = 32 << 20  # glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)
LIMIT_SHARE = 128  # auto: the threshold is this share of the memory limit (scaled_to)
PAGE = 4096
ENV_VAR = "MALLOC_MMAP_THRESHOLD_"
TUNABLE = "glibc.malloc.mmap_threshold"
# the variables through which an environment sets glibc's malloc policy: a process started without
# them runs under glibc's own policy (and under memprof-otel's where it applies one)
MALLOC_ENVIRONMENT = (ENV_VAR, "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


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


def scaled_to(limit_bytes: int) -> int:
    """Pure: the threshold ``auto`` fixes under a memory limit of ``limit_bytes``: 1/128 of it, in
    whole pages, between 1 MiB and glibc's 32 MiB. The blocks a forward near the limit is made of
    are each a few percent of the limit: they are mapped fresh and follow their tensors exactly,
    while the blocks of forwards far below it (each under 1/128 of the limit) stay in the heap and
    cost nothing. In a pod of 4 GiB or more that is 32 MiB, glibc's own dynamic ceiling."""
    share = (limit_bytes // LIMIT_SHARE) & ~(PAGE - 1)
    return max(MIN_BYTES, min(MAX_BYTES, share))


def decide(setting: str | int, limit_bytes: int | None) -> int | None:
    """Pure: the threshold to apply for a ``capacity.mmap_threshold`` setting (``auto``, ``off`` or
    bytes), None for none. ``auto`` applies ``scaled_to`` the memory limit in force
    (``limit_bytes``; None where there is none)."""
    if setting == "off":
        return None
    if setting == "auto":
        return scaled_to(limit_bytes) if limit_bytes is not None else None
    return int(setting)


_lock = threading.Lock()
_NOT_YET = ThresholdState(None, None, "not applied: no instrumented model has started monitoring yet")
_state = _NOT_YET


def state() -> ThresholdState:
    return _state


def apply(setting: str | int, limit_bytes: int | None, environ: Mapping[str, str], backend: str,
          libc: Any = None) -> ThresholdState:
    """Fix the threshold once per process as ``setting`` says, under the memory limit in force
    (``limit_bytes``, None: none), and the trim threshold at twice it (later calls keep the first
    answer that fixed it). ``backend``: which malloc is in use (``glibc`` or another); ``libc`` a
    stand-in in tests. Never raises: a failure is the state's reason."""
    global _state
    with _lock:
        if _state.fixed:
            return _state
        env = from_environment(environ)
        if env is not None:
            _state = ThresholdState(env, "environment", None)
            return _state
        want = decide(setting, limit_bytes)
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
            # Fixing the mmap threshold also stops glibc raising the trim threshold with it, which
            # would leave it at 128 KiB: the top of the heap given back after every forward and
            # faulted in again by the next. 2x the mmap threshold is where glibc's dynamic policy
            # puts it, so the heap below the threshold behaves as it did (a refusal is harmless).
            if ok == 1:
                libc.mallopt(ctypes.c_int(M_TRIM_THRESHOLD), ctypes.c_int(2 * want))
        except (OSError, AttributeError) as e:
            _state = ThresholdState(None, None, f"mallopt is not available: {e}")
            return _state
        if ok != 1:
            _state = ThresholdState(None, None, f"mallopt(M_MMAP_THRESHOLD, {want}) was refused")
            return _state
        _state = ThresholdState(want, "memprof-otel", None)
        log.info("memprof-otel: glibc's mmap threshold fixed at %d bytes (capacity.mmap_threshold: 1/%d of the "
                 "memory limit), so a large forward's resident memory follows its tensors", want, LIMIT_SHARE)
        return _state


def limit_in_force(configured_limit: int | None) -> int | None:
    """The memory limit the kernel or the configuration enforces on this process, in bytes: the
    tighter of a memory cgroup's below the machine's memory and ``capacity.limit_bytes``; None
    where there is neither (an unreadable hierarchy is no limit known)."""
    limits = [configured_limit] if configured_limit is not None else []
    try:
        cgroup = memory_limit(find_dirs().memory)[1]
        if cgroup is not None and cgroup < psutil.virtual_memory().total:
            limits.append(cgroup)
    except Exception:
        pass
    return min(limits) if limits else None


def apply_configured(setting: str | int, configured_limit: int | None) -> ThresholdState:
    """``apply`` with this process's facts: its environment, its malloc, the limit in force. Never
    raises: monitoring starts whatever happens here."""
    global _state
    if _state.fixed:
        return _state
    try:
        backend = HostAllocatorSource.probe().backend
        return apply(setting, limit_in_force(configured_limit), os.environ, backend)
    except Exception as e:  # a probe that failed: glibc's own policy stays, and the state says why
        with _lock:
            _state = ThresholdState(None, None, f"not applied: {type(e).__name__}: {e}")
        return _state


def reset_for_tests() -> None:
    """Forget the state (the process's malloc keeps what was applied)."""
    global _state
    with _lock:
        _state = _NOT_YET


__all__ = ["LIMIT_SHARE", "MALLOC_ENVIRONMENT", "MAX_BYTES", "MIN_BYTES", "ThresholdState", "apply", "apply_configured", "decide",
           "from_environment", "limit_in_force", "scaled_to", "state"]
