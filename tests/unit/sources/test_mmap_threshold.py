"""glibc's mmap threshold: when it is fixed, by whom, and what is left alone."""
from __future__ import annotations

from typing import Any

import pytest

from memprof_otel.config import ConfigError, load_config
from memprof_otel.sources import mmap_threshold as mt


class Libc:
    """A stand-in for libc's mallopt, recording its calls (the real one cannot be undone)."""

    def __init__(self, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    def mallopt(self, param: Any, value: Any) -> int:
        self.calls.append((param.value, value.value))
        return self.answer


@pytest.fixture(autouse=True)
def fresh() -> Any:
    mt.reset_for_tests()
    yield
    mt.reset_for_tests()


def test_auto_fixes_it_only_under_a_limit_at_a_128th_of_it() -> None:
    assert mt.decide("auto", limit_bytes=1000 << 20) == 8000 << 10  # 7.8 MiB, whole pages
    assert mt.decide("auto", limit_bytes=2 << 30) == 16 << 20
    assert mt.decide("auto", limit_bytes=64 << 30) == 32 << 20  # glibc's ceiling (its dynamic one too)
    assert mt.decide("auto", limit_bytes=64 << 20) == 1 << 20  # never under 1 MiB
    assert mt.decide("auto", limit_bytes=(1 << 30) + 12345) % 4096 == 0
    assert mt.decide("auto", limit_bytes=None) is None
    assert mt.decide("off", limit_bytes=1 << 30) is None
    assert mt.decide(65536, limit_bytes=None) == 65536


def test_applied_once_with_mallopt_under_a_limit() -> None:
    libc = Libc()
    st = mt.apply("auto", 1 << 30, {}, "glibc", libc=libc)
    assert st.fixed and st.bytes == 8 << 20 and st.by == "memprof-otel"
    # M_MMAP_THRESHOLD, then M_TRIM_THRESHOLD where glibc's dynamic policy would have put it
    assert libc.calls == [(-3, 8 << 20), (-1, 16 << 20)]
    assert mt.apply(4096, 1 << 30, {}, "glibc", libc=libc) is st  # once per process
    assert len(libc.calls) == 2 and mt.state() is st


@pytest.mark.parametrize("env, expected", [({"MALLOC_MMAP_THRESHOLD_": "262144"}, 262144),
                                           ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=0x20000"},
                                            0x20000)])
def test_what_the_environment_fixed_is_left_as_it_is(env: dict[str, str], expected: int) -> None:
    libc = Libc()
    st = mt.apply("auto", 1 << 30, env, "glibc", libc=libc)
    assert (st.bytes, st.by) == (expected, "environment") and libc.calls == []


def test_nothing_is_done_without_a_limit_or_glibc_or_when_refused() -> None:
    libc = Libc()
    st = mt.apply("auto", None, {}, "glibc", libc=libc)
    assert not st.fixed and "no memory limit" in (st.reason or "") and libc.calls == []
    mt.reset_for_tests()
    st = mt.apply("auto", 1 << 30, {}, "jemalloc", libc=libc)
    assert not st.fixed and "jemalloc" in (st.reason or "") and libc.calls == []
    mt.reset_for_tests()
    refusing = Libc(answer=0)
    st = mt.apply(1 << 20, 1 << 30, {}, "glibc", libc=refusing)
    assert not st.fixed and "refused" in (st.reason or "") and refusing.calls == [(-3, 1 << 20)]


def test_the_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMPROF_OTEL_CAPACITY_MMAP_THRESHOLD", raising=False)  # the suite's own pin
    assert load_config({"capacity": {"mmap_threshold": "2MiB"}}).capacity.mmap_threshold == 2 << 20
    assert load_config({"capacity": {"mmap_threshold": "OFF"}}).capacity.mmap_threshold == "off"
    assert load_config({}).capacity.mmap_threshold == "auto"  # shipped: scaled to a limit where one is in force
    for bad in ("64MiB", "1KiB", "sometimes"):
        with pytest.raises(ConfigError, match="mmap_threshold"):
            load_config({"capacity": {"mmap_threshold": bad}})


def test_a_failing_probe_never_stops_monitoring(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise OSError("no /proc here")
    monkeypatch.setattr(mt.HostAllocatorSource, "probe", staticmethod(broken))
    st = mt.apply_configured("auto", None)
    assert not st.fixed and "OSError" in (st.reason or "")


def test_the_limit_in_force_is_the_tighter_of_the_configured_and_the_cgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mt, "memory_limit", lambda _dir: (None, 3 << 30))
    monkeypatch.setattr(mt.psutil, "virtual_memory", lambda: type("vm", (), {"total": 16 << 30})())
    assert mt.limit_in_force(None) == 3 << 30
    assert mt.limit_in_force(1 << 30) == 1 << 30 and mt.limit_in_force(8 << 30) == 3 << 30
    monkeypatch.setattr(mt, "memory_limit", lambda _dir: (None, 32 << 30))  # over the machine's: no limit
    assert mt.limit_in_force(None) is None and mt.limit_in_force(1 << 30) == 1 << 30


def test_this_process_is_probed_for_real() -> None:
    # no cgroup limit is set for the test runner unless the machine has one: either answer is a state
    st = mt.apply_configured("off", None)
    assert not st.fixed and st.reason is not None and "off" in st.reason
