"""The process's resident high-water mark around a forward, against the kernel: pages touched
between ``begin`` and ``end`` are the rise; a reset in between voids the reading; the lifetime peak
survives the resets. Linux only (``/proc/self/clear_refs``)."""
from __future__ import annotations

import mmap
import sys

import pytest

from memprof_otel.sources.process_hwm import ProcessHighWater, parse_status

MIB = 1 << 20
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")


def touch(n: int) -> mmap.mmap:
    m = mmap.mmap(-1, n)  # anonymous pages, resident once written: what a forward's tensors do
    for i in range(0, n, 4096):
        m[i] = 1
    return m


def hw() -> ProcessHighWater:
    h = ProcessHighWater()
    if h.reason() is not None:
        pytest.skip(h.reason())
    return h


def test_a_transient_is_the_rise_and_what_is_kept_is_retained():
    h = hw()
    mark = h.begin()
    m = touch(64 * MIB)
    m.close()  # freed: gone from RSS, still in the high-water mark
    kept = touch(16 * MIB)
    rise = h.end(mark)
    kept.close()
    assert rise is not None
    assert 60 * MIB <= rise.peak_increase < 72 * MIB  # one after the other: the larger is the peak
    assert 16 * MIB <= rise.retained < 24 * MIB


def test_a_reset_in_between_voids_the_reading():
    h = hw()
    first = h.begin()
    second = h.begin()  # another forward's mark: the first's window began too late
    assert h.end(first) is None
    assert h.end(second) is not None


def test_the_lifetime_peak_survives_the_resets():
    h = hw()
    m = touch(96 * MIB)
    before = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
    m.close()
    h.begin()  # resets the kernel's mark to the (lower) resident size now
    after = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
    assert after < before - 64 * MIB
    assert h.lifetime_peak() >= before - MIB  # (reading the file above grew the heap a little)


def test_in_flight_excess_is_what_was_gained_since_the_forward_began():
    h = hw()
    mark = h.begin()
    assert h.in_flight_excess(mark.start_rss + 5 * MIB) == 5 * MIB
    h.end(mark)
    assert h.in_flight_excess(mark.start_rss + 5 * MIB) == 0


def test_parse_status_reads_kib():
    assert parse_status(b"Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n") == (2048 * 1024, 1024 * 1024)
    assert parse_status(b"Name:\tx\n") is None
