"""JAX's memory figures for one device, as the counter a forward reads at every layer boundary
(``HotCounter``). (Not named ``jax.py``: inside this package it would shadow the library.)

Two ways, chosen by what the device gives:

* Allocator statistics (GPU, TPU): ``device.memory_stats()`` has ``bytes_in_use`` and
  ``peak_bytes_in_use``. JAX has no call to reset that peak: it is the process's highest level so
  far. A window's peak is therefore derived: when ``peak_bytes_in_use`` rose during the window, the
  new high was reached inside it and is its peak exactly; when it did not, the window stayed below
  an earlier high and all that is known is the higher of its two ends, a lower bound.
* Live arrays (CPU, where ``memory_stats()`` is None): the level is the sum of ``nbytes`` of
  ``jax.live_arrays()`` on the device, exact tensor sizes (no allocator rounding). Nothing counts
  between two reads, so a window's peak is the higher of its two ends: a LOWER BOUND of the true
  peak. Arrays made and freed inside one layer, and XLA's temporaries inside one op, are not seen.
  What a layer keeps (its output) is exact.

Both count every array of the device, whichever thread or model made it: the figures are the
device's (the adapter drops a forward that overlapped another).
"""
from __future__ import annotations

import threading
from typing import Any

import jax

from .base import Reading

__all__ = ["JaxMemoryCounter", "LiveArrayBytes", "jax_device_label"]


def jax_device_label(device: Any) -> str:
    """The ``device`` label of a JAX device, as torch's figures of the same device carry it:
    ``"cpu"`` for the CPU, ``"cuda:<id>"`` for a GPU (JAX's platform ``gpu``; its ids on one host
    follow CUDA's order, so the label meets the GPU alerts and the NVML series), else
    ``"<platform>:<id>"`` (``"tpu:1"``)."""
    platform = str(getattr(device, "platform", "cpu")).lower()
    if platform == "cpu":
        return "cpu"
    return f"{'cuda' if platform in ('gpu', 'cuda', 'rocm') else platform}:{getattr(device, 'id', 0)}"


class LiveArrayBytes:
    """Bytes of the live JAX arrays held on one device, summed on every call: a whole array when it
    is on that device alone, else its shards there.

    Every array is visited at every read, so the cost grows with the arrays alive in the process.
    An array's bytes on the device follow from its ``aval`` (shape, dtype) and its ``sharding``
    alone, both objects the array keeps: each array's figure is remembered by ``id`` with those two
    objects and reused while they are the same objects (``is``). A new array under a reused ``id``
    has objects of its own, so it is computed afresh; holding the two objects keeps their ids from
    being reused meanwhile. Reading ``nbytes`` and ``devices()`` afresh cost several times more.
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self._known: dict[int, tuple[Any, Any, int]] = {}  # id(array) -> (aval, sharding, bytes here)

    def _on_device(self, a: Any) -> int:
        devices = a.devices()
        if len(devices) == 1:
            return int(a.nbytes) if self.device in devices else 0
        return sum(int(s.data.nbytes) for s in a.addressable_shards if s.device == self.device)

    def __call__(self) -> int:
        known, now = self._known, {}
        total = 0
        for a in jax.live_arrays():
            try:
                key, aval, sharding = id(a), a.aval, a.sharding
                entry = known.get(key)
                if entry is not None and entry[0] is aval and entry[1] is sharding:
                    n = entry[2]
                else:
                    n = self._on_device(a)
            except RuntimeError:  # deleted between the listing and now (another thread): not live
                continue
            now[key] = (aval, sharding, n)
            total += n
        self._known = now  # only the arrays alive now: the table never outgrows them
        return total


class JaxMemoryCounter:
    """``HotCounter`` over one JAX device: its allocator statistics where it keeps them, else the
    sizes of its live arrays (see the module's docstring for what each peak means).

    ``reserved`` is the level (JAX reports no reserved figure here); ``allocations``/``frees`` are 0
    (not counted) and fragmentation is None (not measured).
    """

    def __init__(self, device: Any = None) -> None:
        self.device = device if device is not None else jax.devices()[0]
        # one read at a time: two callers interleaving would each start a window at the other's level
        self._lock = threading.Lock()
        self.allocator_stats = self.device.memory_stats() is not None
        self._live = LiveArrayBytes(self.device)
        self._level, self._high = self._now()

    def __repr__(self) -> str:
        return f"JaxMemoryCounter({self.device!r}, {'allocator statistics' if self.allocator_stats else 'live arrays'})"

    @property
    def peak_is_lower_bound(self) -> bool:
        """True for live arrays: a window's peak is only the higher of its ends."""
        return not self.allocator_stats

    def _now(self) -> tuple[int, int]:
        """(level, the allocator's all-time peak; the level where it keeps none)."""
        if self.allocator_stats:
            stats = self.device.memory_stats() or {}
            level = int(stats.get("bytes_in_use", 0))
            return level, int(stats.get("peak_bytes_in_use", level))
        level = self._live()
        return level, level

    def reset_peak(self) -> None:
        """Start a new peak window at the current level."""
        with self._lock:
            self._level, self._high = self._now()

    def read_and_reset(self) -> Reading:
        """The level now and the window's peak since the previous read or reset, then a new window."""
        with self._lock:
            start, high_before = self._level, self._high
            level, high = self._now()
            self._level, self._high = level, high
        peak = max(start, level)
        if self.allocator_stats and high > high_before:
            peak = max(peak, high)  # a new all-time high: it was reached inside this window
        return Reading(level, level, peak, 0, 0, None)
