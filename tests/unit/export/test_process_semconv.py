"""Our semconv process instruments against the semantic-conventions package itself: the names,
instrument kinds and units its ``create_*`` helpers use, and its attribute names and values."""
from __future__ import annotations

import os

import pytest

from memprof_otel.export import process_semconv as ours

semconv_metrics = pytest.importorskip("opentelemetry.semconv._incubating.metrics.process_metrics")
cpu_attributes = pytest.importorskip("opentelemetry.semconv._incubating.attributes.cpu_attributes")
disk_attributes = pytest.importorskip("opentelemetry.semconv._incubating.attributes.disk_attributes")


class RecordingMeter:
    """A meter that notes what the semconv helper asks it to create."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str, str]] = []

    def __getattr__(self, method: str):
        kind = {"create_counter": "counter", "create_up_down_counter": "updowncounter",
                "create_observable_gauge": "gauge", "create_observable_counter": "counter",
                "create_observable_up_down_counter": "updowncounter", "create_gauge": "gauge"}[method]

        def create(name: str, callbacks=None, unit: str = "", description: str = ""):
            self.made.append((name, kind, unit))
        return create


def _reference(create) -> tuple[str, str, str]:
    meter = RecordingMeter()
    try:
        create(meter)
    except TypeError:  # the observable ones take callbacks
        create(meter, None)
    (made,) = meter.made
    return made


@pytest.mark.parametrize("name, create", [
    ("process.memory.usage", "create_process_memory_usage"),
    ("process.memory.virtual", "create_process_memory_virtual"),
    ("process.cpu.utilization", "create_process_cpu_utilization"),
    ("process.cpu.time", "create_process_cpu_time"),
    ("process.disk.io", "create_process_disk_io"),
])
def test_name_kind_and_unit_are_the_conventions(name, create):
    mine = {n: (n, kind, unit) for n, kind, unit, _prom, _help in ours.FROM_SERIES}
    mine.update({n: (n, kind, unit) for n, kind, unit, _help in (ours.CPU_TIME, ours.DISK_IO)})
    assert mine[name] == _reference(getattr(semconv_metrics, create))


def test_attribute_names_and_values_are_the_conventions():
    counters = ours.ProcessCounters()
    cpu = counters.cpu_time()
    assert {k for lab, _ in cpu for k in lab} == {cpu_attributes.CPU_MODE}
    assert {lab[cpu_attributes.CPU_MODE] for lab, _ in cpu} == {
        cpu_attributes.CpuModeValues.USER.value, cpu_attributes.CpuModeValues.SYSTEM.value}
    io = counters.disk_io()
    if not io:  # no per-process I/O on this platform
        assert not os.path.exists("/proc/self/io")
        return
    assert {lab[disk_attributes.DISK_IO_DIRECTION] for lab, _ in io} == {
        disk_attributes.DiskIoDirectionValues.READ.value, disk_attributes.DiskIoDirectionValues.WRITE.value}
