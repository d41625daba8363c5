"""TensorFlow's allocator statistics for one device, as the counter a forward reads at every layer
boundary (``HotCounter``).

``tf.config.experimental.get_memory_info(device)`` gives the allocator's ``current`` bytes and its
``peak`` since the last ``reset_memory_stats(device)``, which sets the peak to the current level:
the same one-register model as CUDA's caching allocator, so ``read_and_reset`` has the semantics of
``CudaAllocatorSource.read_and_reset`` (level and peak since the previous read, then the peak
reset), which ``attribution/peaks.py`` folds into nested frames.

What TF counts: the blocks its allocator hands out, not tensor sizes. On CPU (TF 2.21, default
allocator) an allocation of a few KiB is not counted at all, one of 1 MB counts ~192 bytes more,
and a request served from a larger free block counts the whole block (a 2 MiB tensor counted as
3 MiB, a 4 MiB one as 7 MiB after other models had run in the process); MiB-sized activations are
usually exact. Everything the device's allocator serves is counted, whichever thread or
model asked: the figures are the device's, shared by every thread (the adapter drops a forward that
overlapped another). Our resets move TF's own peak register: a host application that reads
``get_memory_info()["peak"]`` sees the peak since our last boundary.
"""
from __future__ import annotations

import threading

import tensorflow as tf

from .base import Reading

__all__ = ["TfAllocatorCounter", "tf_device_label"]


def tf_device_label(device: str) -> str:
    """The ``device`` label of a TF device name, as torch's figures of the same device carry it:
    ``"CPU:0"`` -> ``"cpu"``, ``"GPU:1"`` -> ``"cuda:1"`` (TF numbers the GPUs it sees as CUDA
    does, so the label meets the GPU alerts and the NVML series), others lower-cased."""
    kind, _, index = device.partition(":")
    kind = kind.lower()
    if kind == "cpu":
        return "cpu"
    return f"{'cuda' if kind == 'gpu' else kind}:{index or 0}"


class TfAllocatorCounter:
    """``HotCounter`` over TF's allocator statistics of ``device`` (``"CPU:0"``, ``"GPU:0"``).

    ``allocated`` and ``reserved`` are both TF's ``current``: TF reports no reserved figure.
    ``allocations``/``frees`` are 0 (not counted) and fragmentation is None (not measured).
    """

    def __init__(self, device: str = "CPU:0") -> None:
        self.device = device
        # one read-then-reset at a time: a reset between another caller's read and reset would
        # lose the peak that caller had not yet read
        self._lock = threading.Lock()
        # raises ValueError now (an unknown device, a TF whose CPU allocator keeps no statistics)
        # rather than inside a forward
        tf.config.experimental.get_memory_info(device)

    def __repr__(self) -> str:
        return f"TfAllocatorCounter({self.device!r})"

    def reset_peak(self) -> None:
        """Start a new peak window at the current level."""
        with self._lock:
            tf.config.experimental.reset_memory_stats(self.device)

    def read_and_reset(self) -> Reading:
        """The level now and the peak since the previous read or reset, then a new window."""
        with self._lock:
            info = tf.config.experimental.get_memory_info(self.device)
            tf.config.experimental.reset_memory_stats(self.device)
        current = int(info["current"])
        return Reading(current, current, max(int(info["peak"]), current), 0, 0, None)
