"""Span attribute keys never embed a device: the device is a value."""
from __future__ import annotations

from memprof_otel.export.span_attributes import device_peak_attributes


def test_one_device():
    assert device_peak_attributes({"cpu": 4096}) == {
        "memprof.memory.device": "cpu", "memprof.memory.device_peak_bytes": 4096,
        "memprof.memory.devices": ["cpu"], "memprof.memory.devices_peak_bytes": [4096]}


def test_several_devices_name_the_accelerator_with_the_highest_peak_and_list_all():
    got = device_peak_attributes({"cuda:1": 7 << 30, "cpu": 40 << 30, "cuda:0": 9 << 30})
    assert (got["memprof.memory.device"], got["memprof.memory.device_peak_bytes"]) == ("cuda:0", 9 << 30)
    assert got["memprof.memory.devices"] == ["cpu", "cuda:0", "cuda:1"]
    assert got["memprof.memory.devices_peak_bytes"] == [40 << 30, 9 << 30, 7 << 30]
    assert set(got) == {"memprof.memory.device", "memprof.memory.device_peak_bytes",
                        "memprof.memory.devices", "memprof.memory.devices_peak_bytes"}


def test_equal_peaks_pick_the_first_device_and_no_reading_gives_no_attributes():
    assert device_peak_attributes({"cuda:1": 5, "cuda:0": 5})["memprof.memory.device"] == "cuda:0"
    assert device_peak_attributes({}) == {}
