"""An operation's own rise: peak while open minus a start level read at its start."""
from __future__ import annotations

from memprof_otel.telemetry.operations import OperationTracker
from memprof_otel.timeline import OperationRecord, Sample

MiB = 1 << 20


class ScriptedProbe:
    """A probe double whose readings the test sets: RSS and the allocators read at the start."""

    def __init__(self) -> None:
        self.rss_now = 1000 * MiB
        self.allocs: dict[str, int] = {}
        self.fail_allocators = False

    def rss(self) -> int:
        return self.rss_now

    def allocators(self) -> dict[str, int]:
        if self.fail_allocators:
            raise OSError("allocator read failed")
        return dict(self.allocs)


def test_an_allocator_with_no_start_figure_adds_no_rise() -> None:
    # 256 MiB held before; the glibc figure had no fresh read at the start, a sample shows 320 MiB
    rec = OperationRecord(id=1, name="op", kind="operation", start=0.0, rss_start=500 * MiB, rss_peak=500 * MiB)
    rec.observe(564 * MiB, {"cpu": 320 * MiB})
    rec.rss_end = 500 * MiB
    assert rec.peak_increase_bytes == 64 * MiB  # RSS's rise, not the allocator's level
    assert rec.peak_bytes == 564 * MiB  # the level still counts every figure
    # with a start figure the allocator's own rise counts
    rec.device_start["cpu"] = 200 * MiB
    assert rec.peak_increase_bytes == 120 * MiB


def test_a_failing_allocator_read_keeps_the_rss_start() -> None:
    probe = ScriptedProbe()
    probe.fail_allocators = True
    ops = OperationTracker(probe)
    rec = ops.begin("op", {})
    probe.rss_now = 1064 * MiB
    ops.observe(Sample(t=1.0, process={"resident_memory_bytes": 1064 * MiB}))
    probe.rss_now = 1000 * MiB
    ops.end(rec)
    assert rec.rss_start == 1000 * MiB and rec.peak_increase_bytes == 64 * MiB
    assert ops.errors == 2  # begin's and end's allocator reads, counted
