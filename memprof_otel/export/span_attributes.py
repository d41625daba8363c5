"""Span attribute keys are fixed strings; devices are attribute *values*.

A key that embeds a device (``memprof.memory.cuda:0.peak_bytes``) makes a new attribute name per
device and GPU index: backends index each as its own field, queries have to know the index, and a
fleet with 8-GPU hosts grows 8 keys for one figure. So an operation's allocator peaks go out as:

- ``memprof.memory.device`` (string) and ``memprof.memory.device_peak_bytes`` (int): one device,
  scalar, for queries and alerts ("operations whose accelerator peak passed 20 GB"). It is the
  accelerator with the highest peak, else ``cpu``: where a host has a GPU, the GPU is what runs out
  (the host allocator's figure is usually larger in bytes and rarely the constraint).
- ``memprof.memory.devices`` (string[]) and ``memprof.memory.devices_peak_bytes`` (int[]): every
  device, as parallel arrays sorted by device name; arrays, even for one device, so the type of a
  key never changes from span to span.
"""
from __future__ import annotations

from collections.abc import Mapping

DEVICE = "memprof.memory.device"
DEVICE_PEAK = "memprof.memory.device_peak_bytes"
DEVICES = "memprof.memory.devices"
DEVICES_PEAK = "memprof.memory.devices_peak_bytes"


def device_peak_attributes(device_peak: Mapping[str, int]) -> dict[str, object]:
    """The four attributes for ``{device: allocator peak}``; none when no device was read."""
    if not device_peak:
        return {}
    devices = sorted(device_peak)
    accelerators = [d for d in devices if d != "cpu"]
    primary = max(accelerators or devices, key=lambda d: device_peak[d])  # first of equals
    return {DEVICE: primary, DEVICE_PEAK: int(device_peak[primary]),
            DEVICES: devices, DEVICES_PEAK: [int(device_peak[d]) for d in devices]}
