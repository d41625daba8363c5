"""Reads the budget of a device now (the I/O half of ``memory_budget.py``), cached briefly so a server
can ask before every request: the limit and what others hold move on the sampler's time scale,
not a request's. What this process holds moves with its own forwards: once a forward has begun or
ended since the reading (``in_flight_levels.epoch``), the cached in-use figure is moved by what this
process's own in-use did since (its resident size between forwards on CPU, the allocator's allocated
bytes on CUDA: one cheap read), rather than served as it was. A reading taken before a forward
ended (a scrape, an OTel collection or a watchdog tick, the gate's last ask) is not the level after it: measured under a
memory cgroup (a GPT-2 serving generate() prompts, asked just after each batch it named), a cached
reading was 67 and 425 MiB off a fresh one.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Callable, NamedTuple

import psutil

from ..sources import in_flight_levels, process_hwm, registry
from .memory_budget import MemoryBudget, cgroup_in_use, cuda_budget, hami_limit, host_budget, tighter

TTL_S = 0.25  # a request is tens of milliseconds or more; four reads a second cost nothing


_SELF: psutil.Process | None = None


def resident_now() -> int | None:
    """This process's resident size now, read without touching the process source: its reads move
    the since-reset peak the sampler reports, and a scrape (which asks the capacity figures) must
    leave the sources alone."""
    global _SELF
    try:
        if _SELF is None or _SELF.pid != os.getpid():
            _SELF = psutil.Process()
        return int(_SELF.memory_info().rss)
    except (psutil.Error, OSError):
        return None


def in_flight_excess() -> int:
    """What the process gained since the marked forwards in flight began (0 when none is, without
    a read)."""
    start = process_hwm.shared().in_flight_start()
    if start is None:
        return 0
    rss = resident_now()
    return max(0, rss - start) if rss is not None else 0


def cuda_between_forwards(device: str, allocated: int) -> int:
    """The allocator's allocated bytes as they were between forwards: a reading taken while a
    forward runs holds its transient, which the answer about a request (its predicted peak on top)
    would count twice. Only forwards whose start was read are known (``kernel_reading``)."""
    return allocated - in_flight_levels.shared().excess(device, allocated)


class _Reading(NamedTuple):
    at: float                 # when (the reader's clock)
    forwards: int             # in_flight_levels.epoch() then
    own_in_use: int | None    # this process's own in-use then (``_process_in_use``)
    budget: MemoryBudget | None
    why: str | None


class MemoryBudgetReader:
    def __init__(self, margin_ratio: float, margin_bytes: int, ttl_s: float = TTL_S,
                 clock: Callable[[], float] = time.monotonic, limit_bytes: int | None = None,
                 forwards: Callable[[], int] = in_flight_levels.epoch) -> None:
        self.limit_bytes = limit_bytes
        self.margin_ratio = margin_ratio
        self.margin_bytes = margin_bytes
        self._ttl = ttl_s
        self._clock = clock
        self._forwards = forwards  # the forward starts and ends so far: a reading holds while it stands
        self._lock = threading.Lock()
        self._cache: dict[str, _Reading] = {}

    def read(self, device: str) -> tuple[MemoryBudget | None, str | None]:
        """(budget, None) or (None, why there is none)."""
        now, forwards = self._clock(), self._forwards()
        with self._lock:
            hit = self._cache.get(device)
        if hit is not None and now - hit.at < self._ttl:
            if hit.forwards == forwards or hit.budget is None:
                return hit.budget, hit.why
            own = self._own_in_use(device)
            if own is not None and hit.own_in_use is not None:  # a forward since: what it kept counts
                moved = hit.budget.in_use_bytes + own - hit.own_in_use
                return dataclasses.replace(hit.budget, in_use_bytes=max(0, moved)), hit.why
        try:
            budget, why = self._read(device)
            if self.limit_bytes is not None:
                budget = tighter(budget, self.limit_bytes, self._process_in_use(device),
                                 self.margin_ratio, self.margin_bytes)
                why = None if budget is not None else why
        except Exception as e:  # a source failing is an answer without a limit, never an error
            budget, why = None, f"reading the limit failed: {type(e).__name__}: {e}"
        own = self._own_in_use(device) if budget is not None else None
        with self._lock:
            self._cache[device] = _Reading(now, forwards, own, budget, why)
        return budget, why

    def _own_in_use(self, device: str) -> int | None:
        """``_process_in_use``, None where it cannot be read (never raises: the budget stands)."""
        try:
            return self._process_in_use(device)
        except Exception:
            return None

    def _process_in_use(self, device: str) -> int | None:
        """What counts against ``capacity.limit_bytes``: RSS on CPU, allocated bytes on CUDA (each
        without the transient of the forwards in flight)."""
        if device.startswith("cuda"):
            src = registry.cuda_allocator(int(device.partition(":")[2] or 0))
            return cuda_between_forwards(device, src.reading().allocated) if src is not None else None
        rss = resident_now()
        return rss - process_hwm.shared().in_flight_excess(rss) if rss is not None else None

    def _read(self, device: str) -> tuple[MemoryBudget | None, str | None]:
        if device.startswith("cuda"):
            index = int(device.partition(":")[2] or 0)
            src = registry.cuda_allocator(index)
            if src is None:
                return None, f"{device}: no CUDA allocator source ({registry.down_reasons().get(device, 'unavailable')})"
            mem = src.device_memory()
            if mem is None:
                return None, f"{device}: CUDA is not initialised in this process yet"
            free, total, mig = mem
            r = src.reading()
            # held elsewhere (total - free - reserved) is untouched by a forward in flight: the
            # segments it reserved leave free and join reserved alike
            return cuda_budget(device, total, free, r.reserved, cuda_between_forwards(device, r.allocated), mig,
                               self.margin_ratio, self.margin_bytes, fraction=src.memory_fraction(),
                               hami_bytes=hami_limit(index, os.environ)), None
        if device != "cpu":
            return None, f"no memory limit is known for device {device!r}"
        cg = registry.cgroup()
        limit = in_use = None
        if cg is not None:
            limit = cg.memory_limit()
            charge = cg.memory_charge() if limit is not None else None
            in_use = cgroup_in_use(*charge) if charge is not None else None
        vm = psutil.virtual_memory()
        # a reading taken while a forward runs holds its transient, which the answer about the next
        # request would count twice: take off what the process gained since the forwards in flight began
        excess = in_flight_excess()
        return host_budget(limit, in_use - excess if in_use is not None else None, int(vm.total),
                           int(vm.available) + excess, self.margin_ratio, self.margin_bytes), None
